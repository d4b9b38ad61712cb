"""A start that is refused leaves nothing behind: no run directory, no logs/ folder, no resume record in
the run it wanted to continue; checks that need no model answer before torch is imported; a run that had
written something keeps it, with the error line in its log."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Dict

import pytest

from conftest import ROOT, run_python

NO_TORCH = "raise ImportError('torch was imported before the check')\n"


def _start(script: str, args, cwd: Path, *, block_torch: bool = False):
    """``script`` with ``args`` from ``cwd``; with ``block_torch`` an ``import torch`` fails loudly."""
    env = dict(os.environ)
    if block_torch:
        fake = cwd / "fake-torch"
        (fake / "torch").mkdir(parents=True, exist_ok=True)
        (fake / "torch" / "__init__.py").write_text(NO_TORCH)
        env["PYTHONPATH"] = os.pathsep.join([str(fake), env.get("PYTHONPATH", "")])
    return run_python(ROOT / script, *args, cwd=cwd, env=env)


def _tree(root: Path) -> Dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if "fake-torch" not in p.parts}


def _refused(proc, fix: str) -> None:
    assert proc.returncode == 1, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and fix in lines[0], proc.stderr


@pytest.mark.parametrize(
    "script, args, fix",
    [
        ("train.py", ["data=imagefolder", "data.root=no/such/folder"], "data.root="),
        ("train.py", ["ckpt_path=no/such/last.ckpt"], "pass a checkpoint file"),
        ("train.py", ["trainer.max_epochs=abc"], "trainer.max_epochs='abc' is not a valid Optional[int] "),
        ("train.py", ["trainer.devices=2", "trainer.num_nodes=1.5"], "pass trainer.num_nodes=<int>"),
        ("predict.py", ["ckpt_path=seg.ckpt", "input=empty", "output=out"], "holds no files"),
        ("predict.py", ["ckpt_path=seg.ckpt", "input=no/such/images", "output=out"], "does not exist"),
        ("eval.py", ["ckpt_path=[seg.ckpt,no/such/last.ckpt]"], "no/such/last.ckpt' does not exist"),
        ("eval.py", ["ckpt_path=seg.ckpt", "data=imagefolder", "data.root=no/such/folder"], "data.root="),
    ],
)
def test_a_check_that_needs_no_model_answers_before_torch_and_leaves_nothing(tmp_path, script, args, fix):
    (tmp_path / "empty").mkdir()
    (tmp_path / "seg.ckpt").write_bytes(b"checked later, by the pipeline")
    before = _tree(tmp_path)
    _refused(_start(script, args, tmp_path, block_torch=True), fix)
    assert _tree(tmp_path) == before


def test_a_refused_start_after_the_imports_leaves_nothing(tmp_path):
    proc = _start("train.py", ["debug=tiny_vit", "model.attention.name=no_such_attention"], tmp_path)
    _refused(proc, "no_such_attention")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_the_entry_points_without_the_train_extra_name_its_install(tmp_path, script):
    fake = tmp_path / "no-hydra" / "hydra"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'hydra'\", name='hydra')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    before = _tree(tmp_path)
    _refused(run_python(ROOT / script, cwd=tmp_path, env=env), "pip install 'vitzoo[train]'")
    assert _tree(tmp_path) == before


def test_a_missing_optional_dependency_is_one_line_before_any_run_folder(tmp_path):
    fake = tmp_path / "no-torchattacks" / "torchattacks"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'torchattacks'\")\n")
    (tmp_path / "run.ckpt").write_bytes(b"not read: the install is checked first")
    before = _tree(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake.parent), os.environ.get("PYTHONPATH", "")])}
    proc = run_python(
        ROOT / "eval.py",
        "ckpt_path=run.ckpt",
        "robustness.adversarial=[2]",
        "robustness.attack=autoattack",
        cwd=tmp_path,
        env=env,
    )
    _refused(proc, "needs torchattacks: pip install --no-deps torchattacks==3.5.1")
    assert _tree(tmp_path) == before


@pytest.mark.slow
def test_a_refused_resume_leaves_the_run_as_it_was_and_a_failed_run_keeps_its_error(tmp_path):
    run = tmp_path / "run"
    done = _start("train.py", ["debug=tiny_vit", f"hydra.run.dir={run}"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    before = _tree(tmp_path)
    other = _start(
        "train.py", ["debug=tiny_vit", "model=vit_softmax", f"ckpt_path={run / 'checkpoints' / 'last.ckpt'}"], tmp_path
    )
    _refused(other, "resume with the model= and data= options it was trained with")
    assert _tree(tmp_path) == before  # no .hydra/resume-<time>/, train.log untouched

    # Past its opening line a run has a record worth keeping: it stays, its log ends with the error.
    late = _start("train.py", ["debug=tiny_vit", "data.batch_size=100", f"hydra.run.dir={tmp_path / 'late'}"], tmp_path)
    _refused(late, "lower data.batch_size")
    log = (tmp_path / "late" / "train.log").read_text().strip().splitlines()
    assert "run directory" in log[0] and log[-1].endswith(late.stderr.strip())
    assert (tmp_path / "late" / ".hydra" / "config.yaml").is_file()
