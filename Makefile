# The two commands of the README: `make demo` (offline quickstart) and `make test`.
# Both create .venv on first use and install the package with the CI-pinned torch.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test lint demo

$(STAMP): pyproject.toml constraints-ci.txt requirements-demo.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints-ci.txt -e '.[dev,conformal,ood,laplace,onnx]'
	$(PY) -m pip install --quiet -c constraints-ci.txt -r requirements-demo.txt
	$(PY) -m pip install --quiet -c constraints-ci.txt --no-deps gradio
	touch $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy  # fseb_ft/, as [tool.mypy] in pyproject.toml says

# One worker per core (at most 4), each test module on one worker so its fixtures are built
# once, and one thread per worker so the workers do not oversubscribe the cores.
test: lint
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadscope

# The offline quickstart: PS-MAP vs FS-EB on scikit-learn's digits, printed side by side.
demo: $(STAMP)
	$(PY) -m fseb_ft.finetune recipes/quickstart.yaml --compare
