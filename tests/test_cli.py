"""train.py / eval.py before the pipeline loads: --help and configuration errors, fast and in one line."""

from __future__ import annotations

import pytest

from conftest import run_python


def test_help_lists_the_presets_of_each_script():
    train = run_python("train.py", "--help").stdout.split("== Config")[0]  # the presets, not the config dump
    assert "  model: agent_pvt_tiny," in train and "vit_linear*" in train and "  data: " in train
    assert "model/base" not in train and "robustness" not in train and "  hydra:" not in train
    evaluate = run_python("eval.py", "--help").stdout.split("== Config")[0]
    assert "  robustness: benchmark, clean, default*, zoo" in evaluate and "  model:" not in evaluate


@pytest.mark.parametrize("script", ["train.py", "eval.py"])
def test_help_and_config_errors_do_not_import_torch(script):
    # The script runs as __main__; at exit, report whether torch (and so timm, Lightning) was ever imported.
    probe = (
        "import atexit, sys; atexit.register(lambda: print('torch imported:', 'torch' in sys.modules)); "
        f"sys.argv = [{script!r}] + sys.argv[1:]; exec(compile(open({script!r}).read(), {script!r}, 'exec'))"
    )
    for args in (["--help"], ["data=no_such_data"]):
        assert "torch imported: False" in run_python("-c", probe, *args).stdout


@pytest.mark.parametrize(
    "args, line",
    [
        (
            ["model=no_such_model"],
            "error: model=no_such_model is not a preset; choose one of: agent_pvt_tiny, agent_swin_tiny, ",
        ),
        (["no_such_key=3"], "error: Could not override 'no_such_key'. To append to your config use +no_such_key=3"),
    ],
)
def test_config_errors_are_one_line(args, line):
    proc = run_python("train.py", *args)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), proc.stderr
