"""The model card's usage sections: loading the model with timm and classifying an image, and
``fseb-ft predict`` with the abstention threshold (and its guarantee) kept with the model.

Text only, published: local paths appear as placeholders (:mod:`fseb_ft.runs.published`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from fseb_ft.evaluation.abstention import AbstentionRule
from fseb_ft.runs.published import LOCAL_DIR, placeholders

__all__ = ["certificate", "predict_section", "usage_section"]


def usage_section(
    channels: int,
    temperature: float | None,
    source: Mapping[str, Any],
    repo_id: str | None,
    local_dir: str | Path | None,
) -> str:
    """ "How to use": loading the model with timm (from the Hub as ``repo_id``, or the local
    folder ``local_dir``) and classifying one image of ``channels`` channels, its logits divided
    by the run's ``temperature`` when it has one; ``source`` is the exported model's record
    (``needs_fseb_ft``: the architecture is registered by fseb_ft)."""
    repo = repo_id or "USER/NAME"
    logits = "model(transform(image).unsqueeze(0))"
    scale = ""
    if temperature is not None:
        scale = f"T = {temperature!r}  # temperature scaling (fseb.json); T = 1: raw outputs\n"
        logits = f"({logits} / T)"
    mode = "L" if channels == 1 else "RGB"
    imports = "import numpy as np\nimport timm\nimport torch\nfrom PIL import Image, ImageOps\n"
    if source.get("needs_fseb_ft"):
        imports += "import fseb_ft.method.models  # registers this architecture with timm\n"
    load = f'model = timm.create_model("hf-hub:{repo}", pretrained=True).eval()\n'
    if local_dir is not None:
        path = placeholders(str(local_dir))
        load += (
            "# or from a local copy of this folder:\n"
            f'# model = timm.create_model("{LOCAL_DIR}{path}", pretrained=True).eval()\n'
        )
    return (
        "## How to use\n\n"
        "```python\n"
        f"{imports}\n{load}"
        "config = timm.data.resolve_data_config(model=model)  # this run's input size, mean, std\n"
        "transform = timm.data.create_transform(**config)\n"
        'labels = model.pretrained_cfg["label_names"]\n\n'
        'image = Image.open("image.jpg")\n'
        "image = ImageOps.exif_transpose(image)  # upright by its EXIF orientation, as trained\n"
        'if image.mode.startswith("I;16"):  # 16-bit: to 8 bits as training read it, value >> 8\n'
        "    image = Image.fromarray((np.asarray(image) >> 8).astype(np.uint8))\n"
        f'image = image.convert("{mode}")\n'
        f"{scale}"
        "with torch.no_grad():\n"
        f"    probs = {logits}.softmax(-1)[0]\n"
        "print(labels[int(probs.argmax())], float(probs.max()))\n"
        "```\n"
    )


def predict_section(repo_id: str | None, abstention: AbstentionRule | None) -> str:
    """The ``fseb-ft predict`` command, and the abstention threshold kept with the model."""
    command = (
        f"fseb-ft predict hf-hub:{repo_id or 'USER/NAME'} images/ --out predictions.csv\n"
        "fseb-ft predict RUN_DIR images/ --coverage 0.9 --out predictions.csv  # --max-risk 0.02\n"
    )
    text = (
        "### Predict with abstention\n\n"
        f"```bash\n{command}```\n\n"
        "Each image gets its class, probability, top 3, predictive entropy, an OOD score and an "
        "`abstain` flag: the model abstains when its maximum class probability (after temperature "
        "scaling) is below a threshold. `--coverage` and `--max-risk` choose it on the run's "
        "validation split; `--threshold` sets it; `--keep` stores it with the run, for later "
        "calls and this card.\n"
    )
    if abstention is None or abstention.validation is None:
        return text
    val = abstention.validation
    target = {"coverage": "coverage", "max_risk": "an error rate among accepted images of at most"}
    criterion = abstention.criterion
    how = (
        "set by hand; on the validation split"
        if criterion == "threshold"
        else f"chosen on the validation split for {target.get(criterion, criterion)} "
        f"{abstention.target}: there"
    )
    risk = "n/a" if val.risk is None else f"{100 * val.risk:.2f} %"
    return text + (
        f"\nThis model abstains when its largest probability is below "
        f"**{abstention.threshold:.4g}** (top-class log-odds below "
        f"{abstention.log_odds_threshold:.4g}; kept in `fseb.json` and used by default), "
        f"{how} it accepts {100 * val.coverage:.1f} % of the images "
        f"({val.accepted} of {val.n}) with an error rate of {risk} among them."
        f"{certificate(abstention)}\n"
    )


def certificate(abstention: AbstentionRule) -> str:
    """The sentence of the guarantee a certified threshold carries (empty without one)."""
    cert = abstention.certified
    if cert is None:
        return ""
    asked = (
        f"at most {100 * cast(float, abstention.target):.4g} % with probability at least "
        f"{100 * cert.confidence:.4g} % over the draw of the validation split ({cert.method})"
    )
    empirical = (
        f"the empirical rule for the same risk would accept {100 * cert.empirical_coverage:.1f} %"
    )
    if cert.risk_bound is None:
        return (
            f" No threshold certifies an error rate {asked}, so it abstains on everything; "
            f"{empirical}."
        )
    return (
        f" Certified: the error rate among accepted images is {asked}; its bound at this "
        f"threshold is {100 * cert.risk_bound:.2f} %, and {empirical}."
    )
