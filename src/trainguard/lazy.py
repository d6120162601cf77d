"""Names a package exports but imports on first use (PEP 562), so importing the package stays
cheap: `trainguard` without torch, `trainguard.analyze` and `trainguard.store` without the
writer thread or the sinks.

    __getattr__, __dir__ = lazy_exports(__name__, {"RunReader": "trainguard.store.reader"},
                                        globals())
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, names: Mapping[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module `__getattr__` and `__dir__` of `package`: `names` maps an exported name to the
    module that defines it (a name that is that module itself is the module, `trainguard.recipes`,
    unless the module defines the name: `trainguard.diagnose.preflight` is the function). A loaded
    name is kept in `namespace`, so later lookups skip `__getattr__`."""

    def __getattr__(name: str) -> Any:
        module_name = names.get(name)
        if module_name is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(module_name)
        if module_name == f"{package}.{name}":  # the submodule, unless it defines the name
            value = getattr(module, name, module)
        else:
            value = getattr(module, name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(namespace.get("__all__", ())))

    return __getattr__, __dir__
