"""Where a training checkpoint keeps the model's state dict, and what its names carry.

Training code rarely saves a bare state dict. `select_state_dict` finds it in a checkpoint
tree (raw_formats.py) and logs each choice:

1. Container: the dict of tensors, reached through the usual wrapper keys (`model`,
   `state_dict`, `module`, `model_state_dict`, nested), or `--state-dict-key a.b`. Other
   entries beside it (optimizer, step, ...) are training state and are ignored.
2. Names: a prefix that every name carries is stripped when a wrapper put it there:
   `_orig_mod.` (torch.compile), `module.` (DDP, FSDP1, DeepSpeed,
   `torch.optim.swa_utils.AveragedModel`, whose `n_averaged` counter is dropped), `model.`
   (a wrapper module such as a LightningModule's `self.model`); or `--strip-prefix P`,
   which keeps only the names starting with P.
3. EMA: weights under an EMA key or name prefix (`ema`, `model_ema`, ...) are taken with
   `--ema` and left out without it; `--ema` on a checkpoint without any is an error that
   lists what the checkpoint holds.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from ministream.errors import CheckpointError
from ministream.raw_formats import Node, Other, TensorRef, Tree

log = logging.getLogger(__name__)

WRAPPER_KEYS = ("model", "state_dict", "module", "model_state_dict")
EMA_KEYS = (
    "ema",
    "ema_state_dict",
    "state_dict_ema",
    "model_ema",
    "ema_model",
    "model_ema_state_dict",
    "ema_weights",
)
WRAPPER_PREFIXES = {
    "_orig_mod.": "torch.compile",
    "module.": "DDP/FSDP",
    "model.": "a wrapper module",
}
_AVERAGED_MODEL_COUNTER = "n_averaged"


@dataclass(frozen=True)
class Layout:
    """Where to look: `ministream convert`'s --ema, --state-dict-key and --strip-prefix."""

    ema: bool = False
    state_dict_key: str | None = None
    strip_prefix: str | None = None


@dataclass(frozen=True)
class Selection:
    tensors: dict[str, TensorRef]
    prefix: str  # what was removed in front of the stored names, e.g. "model.module."


def select_state_dict(tree: Tree, layout: Layout, origin: str) -> Selection:
    """The model's tensors, named as the model names them (see the module docstring)."""
    if layout.state_dict_key:
        container, path = _follow(tree, layout.state_dict_key, origin)
    else:
        container, path = _unwrap(tree, layout.ema)
    tensors = _tensors_in(container, path, origin)
    stripped: list[str] = []
    if layout.strip_prefix:
        tensors = _take_prefix(tensors, layout.strip_prefix, origin, "--strip-prefix")
        stripped.append(layout.strip_prefix)
    tensors, auto = _strip_names(tensors, layout.ema, origin)
    full = "".join(f"{key}." for key in path) + "".join(stripped + auto)
    if layout.ema and not any(part in EMA_KEYS for part in full.split(".")):
        raise CheckpointError(
            f"--ema: {origin} has no EMA weights (looked for the keys and name prefixes "
            f"{', '.join(EMA_KEYS)}); it holds {describe(tree)}. Convert the live weights "
            "without --ema, or name the EMA weights with --state-dict-key or --strip-prefix"
        )
    return Selection(tensors, full)


def _unwrap(tree: Tree, ema: bool) -> tuple[Tree, list[str]]:
    node, path = tree, list[str]()
    while (key := _wrapper_key(node, ema)) is not None:
        child = node[key]
        assert isinstance(child, dict)
        beside = {k: v for k, v in node.items() if k != key}
        node, path = child, [*path, key]
        log.info(
            "state dict found under %r%s",
            ".".join(path),
            f"; ignoring beside it: {describe(beside)}" if beside else "",
        )
    return node, path


def _wrapper_key(node: Tree, ema: bool) -> str | None:
    present = [k for k in EMA_KEYS if _holds_tensors(node, k)]
    if present and not ema:
        log.info("the checkpoint also holds EMA weights under %r: pass --ema for those", present[0])
    keys = (*present, *WRAPPER_KEYS) if ema else WRAPPER_KEYS
    return next((k for k in keys if _holds_tensors(node, k)), None)


def _holds_tensors(node: Tree, key: str) -> bool:
    child = node.get(key)
    return isinstance(child, dict) and count_tensors(child) > 0


def _follow(tree: Tree, dotted: str, origin: str) -> tuple[Tree, list[str]]:
    """`--state-dict-key a.b.c`: nested dict keys, then (if any is left) a name prefix."""
    node, path, rest = tree, list[str](), dotted
    while rest:
        keys = [
            k for k, v in node.items() if isinstance(v, dict) and f"{rest}.".startswith(f"{k}.")
        ]
        if not keys:
            prefixed: Tree = {
                n[len(rest) + 1 :]: v
                for n, v in node.items()
                if isinstance(v, TensorRef) and n.startswith(f"{rest}.")
            }
            if prefixed:
                return prefixed, [*path, rest]
            where = f" under {'.'.join(path)!r}" if path else ""
            raise CheckpointError(
                f"--state-dict-key {dotted}: {origin} has no {rest!r}{where}; it holds "
                f"{describe(node)}"
            )
        key = max(keys, key=len)
        child = node[key]
        assert isinstance(child, dict)
        node, path, rest = child, [*path, key], rest[len(key) + 1 :]
    return node, path


def _tensors_in(container: Tree, path: list[str], origin: str) -> dict[str, TensorRef]:
    tensors = {k: v for k, v in container.items() if isinstance(v, TensorRef)}
    where = f"under {'.'.join(path)!r}" if path else "at the top level"
    rest = {k: v for k, v in container.items() if k not in tensors}
    if not tensors:
        raise CheckpointError(
            f"{origin} holds no tensors {where}: it holds {describe(container)}. Pass "
            "--state-dict-key with the dotted path to the model's state dict"
        )
    if rest:
        log.info("ignoring entries beside the state dict (training state): %s", describe(rest))
    return tensors


def _strip_names(
    tensors: dict[str, TensorRef], ema: bool, origin: str
) -> tuple[dict[str, TensorRef], list[str]]:
    """Take or leave EMA name prefixes, then strip wrapper prefixes, until none is left."""
    stripped: list[str] = []
    while True:
        groups = {name.split(".", 1)[0] for name in tensors if "." in name}
        ema_groups = [g for g in EMA_KEYS if g in groups]
        if ema_groups and ema:
            prefix, why = f"{ema_groups[0]}.", "EMA weights"
        elif ema_groups and groups - set(ema_groups):
            tensors = {n: v for n, v in tensors.items() if n.split(".", 1)[0] not in ema_groups}
            log.info("ignoring the EMA weights under %r: pass --ema for those", ema_groups[0])
            continue
        elif wrapper := _wrapper_prefix(tensors):
            prefix, why = wrapper
        else:
            return tensors, stripped
        tensors = _take_prefix(tensors, prefix, origin, why)
        stripped.append(prefix)
        log.info("tensor names start with %r (%s): stripped", prefix, why)


def _wrapper_prefix(tensors: dict[str, TensorRef]) -> tuple[str, str] | None:
    names = set(tensors) - {_AVERAGED_MODEL_COUNTER}  # AveragedModel: module.* + n_averaged
    for prefix, why in WRAPPER_PREFIXES.items():
        if names and all(n.startswith(prefix) for n in names):
            return prefix, why
    return None


def _take_prefix(
    tensors: dict[str, TensorRef], prefix: str, origin: str, why: str
) -> dict[str, TensorRef]:
    taken = {n[len(prefix) :]: v for n, v in tensors.items() if n.startswith(prefix)}
    if not taken:
        raise CheckpointError(
            f"{why} {prefix}: no tensor name in {origin} starts with {prefix!r}; it holds "
            f"{describe(tensors)}"
        )
    left = sorted(n for n in tensors if not n.startswith(prefix))
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        log.info("ignoring tensors whose names do not start with %r: %s", prefix, shown)
    return taken


def count_tensors(node: Node) -> int:
    if isinstance(node, TensorRef):
        return 1
    if isinstance(node, Other):
        return 0
    return sum(count_tensors(child) for child in node.values())


def describe(node: Mapping[str, Node], limit: int = 12) -> str:
    """`'model' (18 tensors), 'step' (int), 'blocks.*' (16 tensors)`: what a level holds."""
    parts = [f"{k!r} ({_kind(v)})" for k, v in node.items() if not isinstance(v, TensorRef)]
    loose = Counter(
        f"{k.split('.', 1)[0]}.*" if "." in k else k
        for k, v in node.items()
        if isinstance(v, TensorRef)
    )
    parts += [f"{group!r} ({_count(n)})" for group, n in loose.items()]
    more = f" and {len(parts) - limit} more" if len(parts) > limit else ""
    return (", ".join(parts[:limit]) + more) or "nothing"


def _kind(node: Node) -> str:
    if isinstance(node, Other):
        return node.kind
    return _count(count_tensors(node)) if count_tensors(node) else "no tensors"


def _count(tensors: int) -> str:
    return f"{tensors} tensor" + ("" if tensors == 1 else "s")


def explain_prefixes(missing: set[str], unexpected: set[str]) -> tuple[str, set[str], set[str]]:
    """One line for unexpected names that are missing names behind a prefix, naming the flag.

    Returns (hint or "", missing names left unexplained, unexpected names left unexplained).
    """
    found: dict[str, set[str]] = {}  # prefix -> missing names found behind it
    for name in unexpected:
        for i, char in enumerate(name):
            if char == "." and name[i + 1 :] in missing:
                found.setdefault(name[: i + 1], set()).add(name[i + 1 :])
    if not found:
        return "", missing, unexpected
    explained = {prefix + name for prefix, names in found.items() for name in names}
    left = missing - set().union(*found.values())
    if len(found) == 1:
        ((prefix, names),) = found.items()
        flag = "--ema" if prefix.split(".", 1)[0] in EMA_KEYS else f"--strip-prefix {prefix}"
        hint = (
            f"the checkpoint names {_count(len(names))} of the model with the prefix "
            f"{prefix!r} (e.g. {prefix}{min(names)}): pass {flag}"
        )
    else:
        counts = ", ".join(f"{p!r} ({len(n)})" for p, n in sorted(found.items()))
        hint = (
            f"the checkpoint names the model's tensors with several prefixes: {counts}; pass "
            "--strip-prefix with the one to convert (--ema for EMA weights)"
        )
    return hint, left, unexpected - explained
