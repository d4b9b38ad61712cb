"""The CPU kernel's build announces itself in one line (what, how long, where it is cached, how to skip it), and
``python -m vitzoo.kernels build`` builds it ahead."""

from types import SimpleNamespace

import pytest
from torch.utils import cpp_extension

from vitzoo.kernels import cpu_kernel as ck
from vitzoo.kernels.__main__ import main as kernels_cli


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    """The builder pointed at ``tmp_path``, its compile replaced by a fake that records the call."""
    calls = []

    def load(name, **kwargs):
        calls.append(name)
        return SimpleNamespace(__file__=str(tmp_path / f"{name}.so"))

    monkeypatch.setattr(cpp_extension, "_get_build_directory", lambda name, verbose: str(tmp_path))
    monkeypatch.setattr(cpp_extension, "load", load)
    ck._build.cache_clear()
    yield calls
    ck._build.cache_clear()  # the next caller builds (loads) the real kernel


def test_a_build_prints_one_line_naming_its_cost_cache_and_skip(fake_build, tmp_path, capsys):
    assert kernels_cli(["build"]) == 0
    out, err = capsys.readouterr()
    assert len(fake_build) == 1 and err.count("\n") == 1
    assert err.startswith("vitzoo: building the CPU linear-attention kernel for ")
    assert f"(about a minute, once per install; cached in {tmp_path})" in err
    assert "VITZOO_CPU_KERNEL=0 skips it, python -m vitzoo.kernels build builds it ahead" in err
    assert out == f"vitzoo: the CPU linear-attention kernel is ready ({tmp_path / fake_build[0]}.so)\n"


def test_a_cached_build_loads_without_a_word(fake_build, tmp_path, capsys):
    name = f"vitzoo_linear_attention_cpu_{ck.torch.backends.cpu.get_cpu_capability().lower()}_{ck._install_tag()}"
    (tmp_path / f"{name}.so").write_bytes(b"")
    assert ck.build_cpu_kernel() is not None
    assert capsys.readouterr().err == "" and fake_build == [name]
