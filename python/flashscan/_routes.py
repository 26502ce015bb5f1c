"""Where the core ops send torch calls that need gradients: a registry the torch adapter fills.

The core ops (`attention`, `scan`) are framework-free and sit below `flashscan.torch`, so they
never import it. When a torch input requires grad and grad mode is on, they look the
differentiable op up here by name and call it. `flashscan.torch` registers its ops when it is
imported; the package (`flashscan/__init__.py`, above both) adds the loader that imports it, so
the public functions route such calls even when the caller never imported `flashscan.torch`.

This module imports nothing from flashscan: the layers read top to bottom,
package -> `torch` adapter -> core ops -> this registry. Only the general path (the first call
of a signature, or a call that needs gradients) comes here; the hot path never does.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["add_loader", "differentiable", "register"]

# op name ("flash_attn_func", "selective_scan_fn") -> its differentiable version
_OPS: dict[str, Callable[..., Any]] = {}
# functions that import an adapter (which then calls `register`), run on the first lookup miss
_LOADERS: list[Callable[[], object]] = []


def register(name: str, fn: Callable[..., Any]) -> None:
    """Serve `name`'s grad-requiring calls with `fn` (an adapter does this when imported)."""
    _OPS[name] = fn


def add_loader(load: Callable[[], object]) -> None:
    """Run `load()` (an adapter's import) the first time an op is looked up unregistered."""
    if load not in _LOADERS:
        _LOADERS.append(load)


def differentiable(name: str) -> Callable[..., Any]:
    """The differentiable version of op `name`, loading the adapters on the first miss."""
    fn = _OPS.get(name)
    if fn is None:
        for load in tuple(_LOADERS):
            load()
        fn = _OPS.get(name)
        if fn is None:
            raise RuntimeError(
                f"{name}: no differentiable op is registered for a call that needs gradients "
                "(import flashscan.torch, or call under torch.no_grad())"
            )
    return fn
