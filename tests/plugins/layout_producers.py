"""Training checkpoints written by the code that writes them in training, for the layout tests.

In-process producers return what `torch.save` would be given; the distributed ones run as
`python -m tests.plugins.layout_producers {ddp,fsdp2-dcp} RAW_PT OUT` so that their
process groups never live in the test process:
- ddp: `DistributedDataParallel` on a one-process gloo group, saved as
  `{"model": ddp.state_dict(), "optimizer": ..., "step": ...}` with `torch.save`;
- fsdp2-dcp: two gloo ranks, `fully_shard` (FSDP2) on CPU, one AdamW step (lr 0: weights
  unchanged, optimizer state written), saved with `torch.distributed.checkpoint.save` as
  `{"model", "optimizer", "ema", "train_state"}` (EMA weights: the live ones halved).

Lightning is not installed here: `lightning_checkpoint` builds the dict that
`Trainer.save_checkpoint` writes (its top-level keys), around a LightningModule-like module.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from ministream.checkpoint import load_raw_state_dict

State = dict[str, torch.Tensor]


def module_of(state: State) -> nn.Module:
    """A module whose `state_dict()` is `state` (parameters at the dotted names)."""
    root = nn.Module()
    for name, tensor in state.items():
        *path, leaf = name.split(".")
        module = root
        for part in path:
            if not hasattr(module, part):
                module.add_module(part, nn.Module())
            module = getattr(module, part)
        module.register_parameter(leaf, nn.Parameter(tensor.detach().clone()))
    return root


def halved(state: State) -> State:
    """Other weights of the same shapes (exactly half: float32 halving is exact)."""
    return {name: tensor * 0.5 for name, tensor in state.items()}


def compiled_state_dict(state: State) -> State:
    """`torch.compile(model).state_dict()`: every name behind `_orig_mod.`."""
    return dict(torch.compile(module_of(state)).state_dict())


class _Wrapper(nn.Module):
    def __init__(self, **children: nn.Module) -> None:
        super().__init__()
        for name, child in children.items():
            self.add_module(name, child)


def lightning_checkpoint(state: State) -> dict[str, Any]:
    """What `Trainer.save_checkpoint` writes for a LightningModule holding `self.model`."""
    lit = _Wrapper(model=module_of(state))
    optimizer = torch.optim.AdamW(lit.parameters(), lr=3e-4)
    return {
        "epoch": 3,
        "global_step": 1200,
        "pytorch-lightning_version": "2.6.6",
        "state_dict": lit.state_dict(),
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4}}}},
        "callbacks": {},
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [],
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 3e-4},
    }


def averaged_model_checkpoint(state: State) -> dict[str, Any]:
    """`{"model", "ema", "step"}` with `AveragedModel` EMA weights = `state`, live = half."""
    model = module_of(state)
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.999))
    with torch.no_grad():  # training moves the live weights on; the EMA lags behind
        for param in model.parameters():
            param.mul_(0.5)
    return {"model": model.state_dict(), "ema": ema.state_dict(), "step": 1}


def timm_checkpoint(state: State) -> dict[str, Any]:
    """timm's train.py: `{"state_dict", "state_dict_ema", "epoch", ...}` (live = half)."""
    return {
        "epoch": 9,
        "arch": "ministream",
        "state_dict": module_of(halved(state)).state_dict(),
        "state_dict_ema": module_of(state).state_dict(),
        "optimizer": {},
    }


def ema_submodule_checkpoint(state: State) -> dict[str, Any]:
    """A LightningModule with `self.model` and a timm-style `self.model_ema.module`."""
    lit = _Wrapper(model=module_of(halved(state)), model_ema=_Wrapper(module=module_of(state)))
    return {"state_dict": lit.state_dict(), "epoch": 2}


# --- distributed producers (own processes) -------------------------------------------


def _init(rank: int, world: int, store: str) -> None:
    dist.init_process_group("gloo", store=dist.FileStore(store, world), rank=rank, world_size=world)


def _ddp(rank: int, raw: str, out: str, store: str) -> None:
    _init(rank, 1, store)
    try:
        ddp = nn.parallel.DistributedDataParallel(module_of(load_raw_state_dict(raw)))
        optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
        torch.save({"model": ddp.state_dict(), "optimizer": optimizer.state_dict(), "step": 7}, out)
    finally:
        dist.destroy_process_group()


def _fsdp2_dcp(rank: int, raw: str, out: str, store: str) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _init(rank, 2, store)
    try:
        mesh = init_device_mesh("cpu", (2,))
        state = load_raw_state_dict(raw)
        model, ema = module_of(state), module_of(halved(state))
        fully_shard(model, mesh=mesh)
        fully_shard(ema, mesh=mesh)
        optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.0)
        loss = sum((p * p).sum() for p in model.parameters())
        assert isinstance(loss, torch.Tensor)
        loss.backward()
        optimizer.step()
        dcp.save(
            {
                "model": get_model_state_dict(model),
                "optimizer": get_optimizer_state_dict(model, optimizer),
                "ema": get_model_state_dict(ema),
                "train_state": {"step": 1, "tokens_seen": 123456},
            },
            checkpoint_id=out,
        )
    finally:
        dist.destroy_process_group()


_DISTRIBUTED = {"ddp": (_ddp, 1), "fsdp2-dcp": (_fsdp2_dcp, 2)}


def main(argv: list[str]) -> None:
    kind, raw, out = argv
    worker, world = _DISTRIBUTED[kind]
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(raw, out, str(Path(tmp) / "store")), nprocs=world)


if __name__ == "__main__":
    main(sys.argv[1:])
