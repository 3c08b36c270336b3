from __future__ import annotations

import pytest

from dpsyn.registry import Registry


def test_register_build_and_errors() -> None:
    reg: Registry = Registry("widget")

    @reg.register("a")
    def make_a(cfg, extra):
        return ("a", cfg.name, extra)

    class Cfg:
        name = "a"

    assert reg.build(Cfg(), 3) == ("a", "a", 3)
    assert "a" in reg and reg.names() == ["a"]
    with pytest.raises(ValueError, match=r"unknown widget 'b'; registered: a"):
        reg.get("b")
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("a")(make_a)
