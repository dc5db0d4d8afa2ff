"""Find the commits that moved a CIFAR-10 protocol's results: a bisect on a short, seeded run.

    python -m benchmarks.bisect_protocol GOOD BAD [--protocol far] [--methods PS-MAP]
        [--train-images 100] [--epochs 1] [--seed 0] [--work /tmp/fseb-bisect]

Each commit tested runs ``python -m benchmarks.paper_cifar10`` *of that commit* (its own driver,
package and recipe, today's libraries) in a detached worktree, on one thread, with one seed, one
epoch and a small training subset. On one thread such a run is deterministic, so two commits
whose runs print the same metrics (every digit) train and evaluate alike, and a commit whose
run prints other metrics changed something that shapes results: pixels, order, initialisation
or a default. The search walks ``git rev-list --first-parent GOOD..BAD`` (a merge stands for its
branch; run again inside the branch to name the commit in it):

1. binary search for the first commit whose metrics differ from GOOD's;
2. from that commit on, again, until the metrics are BAD's: every commit that changed them.

The data the driver extracts from ``../shared`` (``--cache``) is extracted once and shared by
every commit: ``cifar_folder`` and ``cifar_disk``, which build it, are unchanged since before
2026-11-22 (``git log -L``); a range where they change needs one cache per commit.

Each tested commit's metrics are cached in ``WORK/results/SHA-KEY.json``, so a second search over
an overlapping range reruns nothing. A commit whose run fails is passed over, as
``git bisect skip`` does, and named beside a change found next to it (the change may be its).
A change undone later in the range (A → B → A) can go unseen: bisect the halves then.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.seeds import value_at

REPO = Path(__file__).resolve().parents[1]
Result = dict[str, Any]
"""One commit's short run: method → metric → value."""
# The metrics compared between commits, as paths into a run's results.json.
METRIC_PATHS = (("test", "accuracy"), ("test", "nll"), ("test", "ece"))


def git(*args: str) -> str:
    """Output of one git command in this repository, stripped."""
    return subprocess.run(
        ["git", *args], cwd=REPO, check=True, capture_output=True, text=True
    ).stdout.strip()


def commits(good: str, bad: str) -> list[str]:
    """GOOD, then the first-parent commits after it up to BAD, oldest first (full hashes)."""
    between = git("rev-list", "--first-parent", "--reverse", f"{good}..{bad}").split()
    return [git("rev-parse", good), *between]


def digest(results: dict) -> dict[str, float]:
    """The compared numbers of one run: test metrics and every OOD set's entropy AUROC."""
    numbers = {}
    for path in METRIC_PATHS:
        numbers[".".join(path)] = value_at(results, path)
    for name, scores in sorted(results.get("ood", {}).items()):
        numbers[f"ood.{name}.entropy_auroc"] = float(scores["entropy_auroc"])
    return numbers


def run_commit(sha: str, args: argparse.Namespace, key: str) -> Result | None:
    """Each method's digest for one commit (cached), or None when that commit's run fails."""
    cached = args.work / "results" / f"{sha[:12]}-{key}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    tree, out = args.work / "trees" / sha[:12], args.work / "out" / sha[:12]
    if not tree.is_dir():
        git("worktree", "add", "--detach", "--force", str(tree), sha)
    shared = tree.parent / "shared"  # the drivers read ../shared beside the repository
    if not shared.exists():
        shared.symlink_to(REPO.parent / "shared")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    (out / "cache").symlink_to(args.cache.resolve())
    command = [
        sys.executable, "-m", "benchmarks.paper_cifar10", "--protocol", args.protocol,
        "--epochs", str(args.epochs), "--seeds", str(args.seed),
        "--train-images", str(args.train_images), "--methods", *args.methods,
        "--out", str(out), "--results", str(out / "results.md"),
        "--override", "data.num_workers=0", *[f"--override={o}" for o in args.override],
    ]  # fmt: skip
    env = os.environ | {"PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    log = args.work / "logs" / f"{sha[:12]}-{key}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as stream:
        done = subprocess.run(command, cwd=tree, env=env, stdout=stream, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        print(f"  {sha[:10]} failed (exit {done.returncode}); log: {log}", flush=True)
        return None
    found = {}
    for path in sorted(out.glob("**/seed*/results.json")):
        found[path.parent.parent.name] = digest(json.loads(path.read_text()))
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps(found, indent=1, sort_keys=True))
    git("worktree", "remove", "--force", str(tree))
    shutil.rmtree(out, ignore_errors=True)
    return found


def first_change(
    shas: Sequence[str], reference: Result, test: Callable[[str], Result | None]
) -> tuple[int, list[str]]:
    """Index of the first commit of ``shas`` whose result differs from ``reference``.

    ``shas[0]`` gives ``reference`` and ``shas[-1]`` differs from it. Binary search; a commit
    whose run fails (``test`` gives ``None``) is passed over, as ``git bisect skip`` does. Also
    returns the failed commits that lie just before the index found: the change may be in one
    of them instead.
    """
    same, differs, failed = 0, len(shas) - 1, set()
    while untested := [i for i in range(same + 1, differs) if i not in failed]:
        probe = untested[len(untested) // 2]
        result = test(shas[probe])
        if result is None:
            failed.add(probe)
        elif result == reference:
            same = probe
        else:
            differs = probe
    return differs, [shas[i] for i in sorted(failed) if same < i < differs]


def change_points(
    shas: Sequence[str], test: Callable[[str], Result | None]
) -> list[tuple[str, list[str]]]:
    """Every commit after ``shas[0]`` whose result differs from its predecessor's (as found
    by :func:`first_change` from each change on, until the result is that of ``shas[-1]``),
    each with the failed commits the change may lie in instead."""
    start, end = test(shas[0]), test(shas[-1])
    if start is None or end is None:
        raise SystemExit("an endpoint's run failed; see the logs under --work")
    changes, position, reference = [], 0, start
    while reference != end:
        index, failed = first_change(shas[position:], reference, test)
        position += index
        changes.append((shas[position], failed))
        reference = test(shas[position])
    return changes


def describe(sha: str) -> str:
    """One line: short hash, date and subject of a commit."""
    return git("log", "-1", "--format=%h %ad %s", "--date=short", sha)[:160]


def main() -> None:
    """CLI: every first-parent commit between GOOD and BAD that changed the short run's metrics."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("good", help="a commit whose run gives the old numbers")
    parser.add_argument("bad", help="a later commit whose run gives the new numbers")
    parser.add_argument("--protocol", default="far", choices=("far", "near", "context"))
    parser.add_argument("--methods", nargs="+", default=["PS-MAP"])
    parser.add_argument("--train-images", type=int, default=100, help="per class")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--override", action="append", default=[], help="extra recipe override")
    parser.add_argument("--work", type=Path, default=Path("/tmp/fseb-bisect"))
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="the drivers' extracted data (default WORK/cache), shared by every commit",
    )
    args = parser.parse_args()
    args.cache = args.cache or args.work / "cache"
    setting = [args.protocol, args.methods, args.train_images, args.epochs, args.seed]
    setting.append(args.override)
    key = hashlib.sha256(json.dumps(setting).encode()).hexdigest()[:10]
    shas = commits(args.good, args.bad)
    print(f"{len(shas)} commits from {describe(shas[0])}\n  to {describe(shas[-1])}", flush=True)

    def test(sha: str) -> Result | None:
        result = run_commit(sha, args, key)
        print(f"  {describe(sha)[:90]}\n    {json.dumps(result)}", flush=True)
        return result

    changes = change_points(shas, test)
    print("\nCommits that changed the metrics:" if changes else "\nNo commit changed them.")
    for sha, failed in changes:
        print(f"  {describe(sha)}")
        if failed:
            print("    or one of these, whose run failed: " + ", ".join(s[:10] for s in failed))


if __name__ == "__main__":
    main()
