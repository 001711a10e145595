"""A runtime-checkable Protocol's isinstance checks method names only; this checks the calls."""

from __future__ import annotations

import inspect


def assert_takes_protocol_calls(obj: object, protocol: type) -> None:
    """Every public method ``protocol`` declares exists on ``obj`` and takes the same parameters
    with the same defaults; extra parameters are allowed only after them and with defaults."""
    assert isinstance(obj, protocol)
    names = [n for n, v in vars(protocol).items() if inspect.isfunction(v) and not n.startswith("_")]
    assert names, f"{protocol.__name__} declares no methods"
    for name in names:
        declared = list(inspect.signature(getattr(protocol, name)).parameters.values())
        actual = list(inspect.signature(getattr(type(obj), name)).parameters.values())
        shape = [(p.name, p.kind, p.default) for p in declared]
        assert [(p.name, p.kind, p.default) for p in actual[:len(declared)]] == shape, (name, actual)
        extra = [p.name for p in actual[len(declared):] if p.default is inspect.Parameter.empty]
        assert not extra, (name, extra)
