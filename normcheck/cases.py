"""Case: one fully specified problem, and the inputs it deterministically makes.

A Case is frozen and hashable; the same Case always makes bit-identical inputs. Inputs are made
once as a float64 master copy, quantised to the case's dtypes; the reference sees those quantised
values upcast to float64, the implementation sees them in the case's dtypes and memory formats.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

import numpy as np
import torch

from .dtypes import TORCH_DTYPES, DtypeSpec, quantise
from .errors import UsageError
from .layouts import check_format, lay_out
from .profiles import PROFILES
from .sets import SetView

OPS = ("batchnorm", "groupnorm", "syncbn", "syncbn_silu")
DISTRIBUTED_OPS = ("syncbn", "syncbn_silu")


@dataclass(frozen=True)
class Case:
    op: str
    shape: tuple[int, ...]
    dtype: str = "f32"            # x, dy, y, dx
    param_dtype: str | None = None  # γ, β, running stats; None: same as dtype
    x_format: str = "contiguous"
    dy_format: str | None = None  # None: same as x_format
    profile: str = "normal"
    eps: float = 1e-5
    momentum: float = 0.1
    affine: bool = True
    groups: int | None = None     # GroupNorm only
    seed: int = 0
    split: tuple[int, ...] | None = None  # per-rank batch sizes (SyncBN); None: one process
    gamma_scale: float = 1.0      # multiplies γ: recipes that divide by γ fail as it shrinks

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if self.param_dtype is None:
            object.__setattr__(self, "param_dtype", self.dtype)
        if self.dy_format is None:
            object.__setattr__(self, "dy_format", self.x_format)
        if self.split is not None:
            object.__setattr__(self, "split", tuple(int(s) for s in self.split))
        elif self.op in DISTRIBUTED_OPS and self.shape:
            object.__setattr__(self, "split", (int(self.shape[0]),))  # one rank holds the whole batch
        self.validate()

    # -- validation: every message is one line a person can act on -------------------------
    def validate(self) -> None:
        if self.op not in OPS:
            raise UsageError(f"unknown op {self.op!r}; choose one of {', '.join(OPS)}")
        if not 2 <= len(self.shape) <= 5:
            raise UsageError(f"shape {self._shape_text} must be (N, C) plus 0 to 3 spatial dims")
        if any(s < 0 for s in self.shape) or self.shape[1] < 1:
            raise UsageError(f"shape {self._shape_text} has a negative size or no channels")
        for name in (self.dtype, self.param_dtype):
            if name not in TORCH_DTYPES:
                raise UsageError(f"unknown dtype {name!r}; choose one of {', '.join(TORCH_DTYPES)}")
        if self.param_dtype != self.dtype and not (self.param_dtype == "f32" and self.dtype in ("f16", "bf16")):
            raise UsageError(
                f"parameter dtype {self.param_dtype} with input {self.dtype}: mixed precision means f16/bf16 input with f32 parameters"
            )
        check_format(self.x_format, len(self.shape))
        check_format(self.dy_format, len(self.shape))
        if self.profile not in PROFILES:
            raise UsageError(f"unknown profile {self.profile!r}; choose one of {', '.join(PROFILES)}")
        if not self.eps >= 0:
            raise UsageError(f"eps must be >= 0, got {self.eps}")
        if self.op == "groupnorm":
            if self.groups is None or self.groups < 1:
                raise UsageError("groupnorm needs --groups G with G >= 1")
            if self.shape[1] % self.groups:
                raise UsageError(f"C={self.shape[1]} is not divisible by groups={self.groups}")
        elif self.groups is not None:
            raise UsageError(f"--groups applies to groupnorm only, not {self.op}")
        if self.view.set_size < 2:
            unit = "group" if self.op == "groupnorm" else "channel"
            raise UsageError(f"shape {self._shape_text} gives {self.view.set_size} values per {unit}; normalising needs at least 2")
        if self.split is not None:
            if not self.split:
                raise UsageError("split must name at least one rank")
            if any(s < 0 for s in self.split):
                raise UsageError(f"split {self.split} has a negative size")
            if sum(self.split) != self.shape[0]:
                raise UsageError(f"split {self.split} sums to {sum(self.split)}, not N={self.shape[0]}")

    @property
    def _shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    # -- derived facts ----------------------------------------------------------------------
    @property
    def dtypes(self) -> DtypeSpec:
        return DtypeSpec(self.dtype, self.param_dtype)

    @property
    def view(self) -> SetView:
        return SetView(self.shape, self.groups)

    @property
    def channels(self) -> int:
        return self.shape[1]

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def label(self) -> str:
        fmt = self.x_format if self.dy_format == self.x_format else f"{self.x_format}:{self.dy_format}"
        parts = [self._shape_text, self.dtypes.label, fmt, self.profile]
        if self.groups is not None:
            parts.insert(1, f"G={self.groups}")
        if self.split is not None:
            parts.append("split=" + ",".join(map(str, self.split)))
        if not self.affine:
            parts.append("no-affine")
        if self.gamma_scale != 1.0:
            parts.append(f"gamma×{self.gamma_scale:g}")
        return " ".join(parts)

    def with_(self, **changes) -> "Case":
        return replace(self, **changes)

    def make_inputs(self) -> "CaseInputs":
        return CaseInputs.make(self)


@dataclass(frozen=True)
class CaseInputs:
    """Quantised float64 master copies of every input (canonical contiguous layout)."""

    case: Case
    x: np.ndarray
    dy: np.ndarray
    weight: np.ndarray | None
    bias: np.ndarray | None
    running_mean: np.ndarray
    running_var: np.ndarray

    @classmethod
    def make(cls, case: Case) -> "CaseInputs":
        rng = np.random.default_rng([case.seed, _stable_hash(case)])
        view = case.view
        x_sets, dy_sets = PROFILES[case.profile](view.set_count, view.set_size, case.dtype, case.eps, rng)
        c = case.channels
        # γ not all ones and β not all zeros, with both signs: a kernel that drops or swaps them shows.
        weight = rng.choice([-1.0, 1.0], size=c) * rng.uniform(0.5, 1.5, size=c) * case.gamma_scale
        bias = rng.uniform(-1, 1, size=c)
        running_mean = rng.normal(0, 0.1, size=c)
        running_var = rng.uniform(0.5, 1.5, size=c)
        q, qp = case.dtype, case.param_dtype
        return cls(
            case=case,
            x=quantise(view.from_sets(x_sets), q),
            dy=quantise(view.from_sets(dy_sets), q),
            weight=quantise(weight, qp) if case.affine else None,
            bias=quantise(bias, qp) if case.affine else None,
            running_mean=quantise(running_mean, qp),
            running_var=quantise(running_var, qp),
        )

    def torch_inputs(self) -> "TorchInputs":
        """Fresh torch tensors in the case's dtypes and layouts (new storage on every call)."""
        case = self.case
        dt, pdt = TORCH_DTYPES[case.dtype], TORCH_DTYPES[case.param_dtype]

        def param(a):
            return None if a is None else torch.from_numpy(a.copy()).to(pdt)

        return TorchInputs(
            x=lay_out(torch.from_numpy(self.x).to(dt), case.x_format),
            dy=lay_out(torch.from_numpy(self.dy).to(dt), case.dy_format),
            weight=param(self.weight),
            bias=param(self.bias),
            running_mean=param(self.running_mean),
            running_var=param(self.running_var),
        )


@dataclass
class TorchInputs:
    x: torch.Tensor
    dy: torch.Tensor
    weight: torch.Tensor | None
    bias: torch.Tensor | None
    running_mean: torch.Tensor
    running_var: torch.Tensor

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Copies of the tensors an implementation must not modify."""
        named = {"x": self.x, "dy": self.dy, "weight": self.weight, "bias": self.bias}
        return {k: v.detach().clone() for k, v in named.items() if v is not None}

    def modified_since(self, snap: dict[str, torch.Tensor]) -> list[str]:
        named = {"x": self.x, "dy": self.dy, "weight": self.weight, "bias": self.bias}
        return [k for k, before in snap.items() if not _same_bits(named[k].detach(), before)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and bool(torch.equal(a.isnan(), b.isnan())) and bool(
        torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    )


def _stable_hash(case: Case) -> int:
    """A seed component from the fields that define the data, stable across processes (unlike hash()).

    Layouts, momentum, the world split and γ's scale are left out on purpose: the same seed gives
    the same values whether they are laid out channels-last, split over 3 ranks or scaled.
    """
    import zlib

    fields = (case.op, case.shape, case.dtype, case.param_dtype, case.profile, case.eps, case.affine, case.groups)
    return zlib.crc32(repr(fields).encode())
