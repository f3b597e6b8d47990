"""Models that the server and every silo agree on, plus their (de)serialisation.

The server and the silos must build byte-identical architectures so that a parameter dictionary produced on one side
loads on the other; :func:`build_model` is the single place where those architectures are defined.

Every model maps a float32 batch ``(n, num_features)`` to LOGITS ``(n, num_labels)``; the model output of the papers is
``F(x; theta) = softmax(logits)`` (SteFFLe, Gupta et al. 2024, Section 3 before Theorem 3.2: "the output of a neural net
after softmax layer").

Binary heads (``num_labels == 2``) have ONE linear output ``z`` and return the logits ``[0, z]``. Then
``softmax([0, z]) = (1 - sigmoid(z), sigmoid(z))``, the papers' binary logistic model, and cross-entropy on these logits
equals BCE-with-logits on ``z`` (the released SteFFLe code trains with ``BCEWithLogitsLoss``). The output stays in the
full ``l = 2`` form of the papers (``W in R^{k x l}``, SteFFLe Theorem 3.2; silofl does not copy the released code's 1x1
reduction of the fairness block), while the parameter count matches the papers' logistic regression (``d + 1``).
Multi-class heads (``num_labels > 2``) are an ordinary multinomial ``Linear(d, l)``.

A user's own model (``--model module.path:factory``, docs/CUSTOM_MODEL.md) is built by calling
``factory(num_features, num_labels)`` with torch's global RNG seeded from the run's seed (and restored afterwards),
so the server and the silos build the same module; :func:`check_model` is what the server checks before any round.
It must return logits ``(n, num_labels)`` as well: the loss is :func:`loss_fn` on them, whatever the model, and a
binary model returns two logits (``[0, z]`` as above, or any two).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from silofl.protocols.model_names import MODEL_KINDS, is_custom_model

__all__ = [
    "MODEL_KINDS",
    "ModelError",
    "TabularModel",
    "build_model",
    "check_model",
    "get_parameters",
    "loss_fn",
    "parameter_spec",
    "predict",
    "set_parameters",
]


class ModelError(ValueError):
    """A user's model (``--model module:factory``) that silofl cannot train: the message names ``--model``, what is
    wrong and the fix."""


class TabularModel(nn.Module):
    """Logistic regression (``hidden is None``) or a one-hidden-layer ReLU MLP, returning logits.

    Parameters are named ``hidden.weight``/``hidden.bias`` (MLP only) and ``head.weight``/``head.bias``. The module
    has no buffers, so its ``state_dict`` holds exactly its trainable parameters.
    """

    def __init__(self, num_features: int, num_labels: int, hidden: int | None) -> None:
        super().__init__()
        self.num_features = num_features
        self.num_labels = num_labels
        # Built inside fork_rng so that nn.Linear's default init does not move the global RNG; build_model then
        # initialises them from a seed. (Not nn.utils.skip_init: its meta-device path imports torch._refs and
        # torch.fx on first use, ~0.9 s that a deployed ClientApp pays on every message.)
        with torch.random.fork_rng(devices=[]):
            self.hidden: nn.Linear | None = None if hidden is None else nn.Linear(num_features, hidden)
        head_in = num_features if hidden is None else hidden
        head_out = 1 if num_labels == 2 else num_labels
        with torch.random.fork_rng(devices=[]):
            self.head: nn.Linear = nn.Linear(head_in, head_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(n, num_labels)`` for a batch ``(n, num_features)``."""
        if x.shape[-1] != self.num_features:
            raise ValueError(
                f"input has {x.shape[-1]} features but the model was built with num_features={self.num_features}; "
                "encode the data with the same feature pipeline as the model"
            )
        h = x if self.hidden is None else torch.relu(self.hidden(x))
        return self.to_logits(self.head(h))

    def to_logits(self, z: torch.Tensor) -> torch.Tensor:
        """The head's output as logits: ``[0, z]`` for a binary head (softmax gives (1 - sigmoid(z), sigmoid(z)))."""
        if self.num_labels == 2:
            return torch.cat([torch.zeros_like(z), z], dim=-1)
        return z

    def head_output_grads(self, logit_grads: torch.Tensor) -> torch.Tensor:
        """The vector-Jacobian product of :meth:`to_logits`: d total / d z from d total / d logits ``(n, l)``.

        Binary head: column 1 (the ``z`` of ``[0, z]``), the view autograd's backward of the ``cat`` gives; else the
        logits themselves."""
        return logit_grads.narrow(1, 1, 1) if self.num_labels == 2 else logit_grads


def _check_positive_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _init_linear(layer: nn.Linear, generator: torch.Generator) -> None:
    """PyTorch's default ``nn.Linear`` distribution, U(-1/sqrt(fan_in), 1/sqrt(fan_in)), drawn from ``generator``."""
    bound = 1.0 / math.sqrt(layer.in_features)
    with torch.no_grad():
        nn.init.uniform_(layer.weight, -bound, bound, generator=generator)
        nn.init.uniform_(layer.bias, -bound, bound, generator=generator)


def build_model(kind: str, num_features: int, num_labels: int, *, hidden: int = 64, seed: int = 0) -> nn.Module:
    """Build a float32 model returning logits ``(n, num_labels)``.

    ``kind`` is ``"logreg"`` (the papers' model), ``"mlp"`` (``d -> hidden -> ReLU -> head``) or a user's
    ``"module:factory"`` (:func:`build_custom_model`); the head rule for ``num_labels == 2`` is described in the
    module docstring. Initialisation is a deterministic function of ``seed`` through a private ``torch.Generator``
    (a custom model: torch's global generator, seeded and restored), so building a model never changes the global
    RNG state, and the server and the silos get the same initial weights from the same seed. ``hidden`` is ignored
    for ``logreg`` and custom models.
    """
    num_features = _check_positive_int("num_features", num_features, 1)
    num_labels = _check_positive_int("num_labels", num_labels, 2)
    seed = _check_positive_int("seed", seed, 0)
    if is_custom_model(kind):
        return build_custom_model(kind, num_features, num_labels, seed=seed)
    if kind not in MODEL_KINDS:
        raise ValueError(f"kind must be one of {MODEL_KINDS} or MODULE:FACTORY, got {kind!r}")
    hidden = _check_positive_int("hidden", hidden, 1)

    model = TabularModel(num_features, num_labels, hidden if kind == "mlp" else None)
    generator = torch.Generator().manual_seed(seed)
    if model.hidden is not None:
        _init_linear(model.hidden, generator)
    _init_linear(model.head, generator)
    return model.float()


# -- a user's model (--model module:factory) ----------------------------------------------------------------------

_MODEL_DOC = "docs/CUSTOM_MODEL.md"


def load_factory(kind: str, signature: str = "(num_features, num_labels)") -> Callable[..., nn.Module]:
    """The factory a custom model's name (``module.path:factory``) names, imported; ModelError naming ``--model``,
    the module and the fix when it cannot be (the module is not installed where this process runs, or lacks the
    attribute, or the attribute is not callable). `signature` is the call the errors describe: a tabular model's
    ``(num_features, num_labels)``, FedSC's encoder's ``(image_shape)`` (`protocols.ssl_encoder`)."""
    module_name, _, attribute = kind.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ModelError(
            f"--model {kind}: module {module_name!r} cannot be imported here ({exc}); install the package that holds "
            "it where the server and every silo run (pip install -e ., or PYTHONPATH), or run `silofl run` from the "
            f"folder that holds it ({_MODEL_DOC})"
        ) from exc
    except Exception as exc:  # the user's module failed while it was imported: say so, with its own error
        raise ModelError(
            f"--model {kind}: importing module {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from exc
    factory = getattr(module, attribute, None)
    if factory is None:
        raise ModelError(
            f"--model {kind}: module {module_name!r} has no attribute {attribute!r}; name a function "
            f"{attribute}{signature} -> torch.nn.Module defined in it ({_MODEL_DOC})"
        )
    if not callable(factory):
        raise ModelError(
            f"--model {kind}: {kind} is an object of type {type(factory).__name__}, not a function {signature}"
        )
    return factory


def build_custom_model(kind: str, num_features: int, num_labels: int, *, seed: int = 0) -> nn.Module:
    """``factory(num_features, num_labels)`` of the user's ``module:factory``, built on the CPU with torch's global
    RNG seeded by ``seed`` (restored afterwards: building never moves the caller's RNG), then checked for what every
    silofl round needs of its structure (:func:`check_model_structure`). ModelError naming ``--model`` otherwise."""
    factory = load_factory(kind)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        try:
            model = factory(num_features, num_labels)
        except Exception as exc:
            raise ModelError(
                f"--model {kind}: {kind}({num_features}, {num_labels}) raised {type(exc).__name__}: {exc}; the "
                "factory is called with the number of encoded features and of labels of the run's data"
            ) from exc
    check_model_structure(kind, model)
    return model


def check_model_structure(kind: str, model: object) -> None:
    """What silofl's rounds need of a model's structure, without running it: a ``torch.nn.Module``; no BatchNorm
    and no Dropout; at least one parameter; every parameter float32, finite and trainable; and a ``state_dict`` that
    holds exactly the parameters, in their order (the wire layout of every update: `parameter_spec`). ModelError
    naming ``--model``, the layer or parameter, and the fix.

    Why each: BatchNorm normalizes a record with its batch's statistics, so a record's gradient depends on the other
    records and per-sample gradients (DP clipping, `torch.func` vmap) are not defined; its running statistics are
    buffers besides. Dropout draws from torch's global RNG: a silo's round would no longer be a function of the run's
    seed, and vmap refuses random operations. Buffers and tied weights would not travel (silofl sends, averages and
    checks the parameters only). A float64 parameter would be cut to float32 on the wire, a frozen one updated all
    the same."""
    if not isinstance(model, nn.Module):
        raise ModelError(
            f"--model {kind}: the factory returned a {type(model).__name__}, not a torch.nn.Module ({_MODEL_DOC})"
        )
    for name, layer in model.named_modules():
        where = f"layer {name!r} ({type(layer).__name__})" if name else f"the model ({type(layer).__name__})"
        if isinstance(layer, nn.modules.batchnorm._BatchNorm):
            raise ModelError(
                f"--model {kind}: {where} is a BatchNorm: it normalizes each record with the statistics of its "
                "batch, so a record's gradient depends on the other records and per-sample gradients (the "
                "per-record clipping of DP, torch.func vmap) are not defined for it; use LayerNorm or GroupNorm, "
                "which normalize each record on its own"
            )
        if isinstance(layer, nn.modules.dropout._DropoutNd):
            raise ModelError(
                f"--model {kind}: {where} is a Dropout: it draws from torch's global RNG, so a silo's round would "
                "no longer follow from the run's seed (and torch.func vmap refuses random operations); remove it"
            )
    params = list(model.named_parameters())
    if not params:
        raise ModelError(f"--model {kind}: the model has no parameters to train")
    for name, p in params:
        if p.dtype != torch.float32:
            raise ModelError(
                f"--model {kind}: parameter {name!r} is {p.dtype}; silofl's models and updates are float32: build "
                "the model in the default dtype (or return model.float())"
            )
        if not p.requires_grad:
            raise ModelError(
                f"--model {kind}: parameter {name!r} is frozen (requires_grad=False), yet it would be sent and "
                "averaged; make a constant a buffer with register_buffer(..., persistent=False)"
            )
        if not bool(torch.isfinite(p.detach()).all()):
            raise ModelError(f"--model {kind}: parameter {name!r} holds NaN or inf values after the factory built it")
    state = list(model.state_dict())
    names = [name for name, _ in params]
    if state != names:
        extra = [n for n in state if n not in names]
        why = (
            f"its state_dict also holds {extra}: buffers (or tied weights) that silofl would not send or average; "
            "make a constant buffer non-persistent (register_buffer(..., persistent=False))"
            if extra
            else "its state_dict lists the parameters in another order"
        )
        raise ModelError(f"--model {kind}: {why}")


def check_model(kind: str, num_features: int, num_labels: int, *, seed: int = 0, probe: int = 4) -> None:
    """The server's checks of the run's model before any round (`server.orchestrator`, and `silofl run`'s preflight
    before the federation starts): nothing for silofl's own models; for a user's ``module:factory``, that it is
    importable here and builds (:func:`build_custom_model`), and that on a probe batch of `probe` records

    * its output is a float32 tensor of logits ``(n, num_labels)`` with finite values (what :func:`loss_fn`,
      softmax fairness terms and predictions read);
    * each record's output does not depend on the other records of the batch (one record's contribution must be
      bounded on its own: the per-record sensitivity every noised release assumes);
    * per-sample gradients of the loss through ``torch.func`` (``functional_call`` + ``vmap(grad)``), what DP-SGD
      clips, work and are finite and shaped as the parameters.

    ModelError naming ``--model``, what failed and the fix. The probe batch is a fixed draw (no data of any silo)."""
    if not is_custom_model(kind):
        return
    from torch.func import functional_call, grad, vmap  # the server's check only: a silo's import path stays light

    model = build_model(kind, num_features, num_labels, seed=seed)
    x = torch.randn(probe, num_features, generator=torch.Generator().manual_seed(0))
    y = torch.arange(probe) % num_labels
    try:
        with torch.no_grad():
            out = model(x)
            single = [model(x[i : i + 1]) for i in range(probe)]
    except Exception as exc:
        raise ModelError(
            f"--model {kind}: the model fails on a batch of {probe} records of {num_features} float32 features: "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (probe, num_labels):
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise ModelError(
            f"--model {kind}: the model returns {shape} for a batch of {probe} records; silofl needs logits "
            f"(n, num_labels) = ({probe}, {num_labels}): one per label, two for a binary target (cross-entropy on "
            "them is the loss)"
        )
    if out.dtype != torch.float32:
        raise ModelError(f"--model {kind}: the model returns {out.dtype} logits; return float32")
    if not bool(torch.isfinite(out).all()):
        raise ModelError(f"--model {kind}: the model returns NaN or inf logits at its initial parameters")
    if not torch.allclose(torch.cat(single), out, rtol=1e-4, atol=1e-5):
        raise ModelError(
            f"--model {kind}: a record's output depends on the other records of its batch (model(x)[i] differs "
            "from model(x[i:i+1])); each record's contribution to a noised release must be bounded on its own: "
            "normalize per record (LayerNorm), never across the batch"
        )
    params = {name: p.detach() for name, p in model.named_parameters()}

    def one_record_loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        return loss_fn(functional_call(model, p, (xi.unsqueeze(0),)), yi.unsqueeze(0))

    try:
        grads = vmap(grad(one_record_loss), in_dims=(None, 0, 0))(params, x, y)
    except Exception as exc:
        raise ModelError(
            f"--model {kind}: per-sample gradients (torch.func functional_call + vmap(grad)), which the private "
            f"algorithms clip record by record, fail on this model: {type(exc).__name__}: {exc}; keep to layers "
            "that treat each record on its own (Linear, LayerNorm, activations, Conv on a reshaped record)"
        ) from exc
    for name, p in params.items():
        g = grads[name]
        if tuple(g.shape) != (probe, *p.shape) or not bool(torch.isfinite(g).all()):
            raise ModelError(
                f"--model {kind}: the per-sample gradient of parameter {name!r} is not finite or not shaped "
                f"({probe}, *{tuple(p.shape)}) (got {tuple(g.shape)})"
            )


def model_device(model: nn.Module) -> torch.device:
    """The device the model's parameters live on (the silo's resolved `device`; the CPU for a model without any)."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def parameter_spec(model: nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    """Names and shapes of the model's entries, in ``state_dict`` order (the wire layout of flat vectors)."""
    return [(name, tuple(value.shape)) for name, value in model.state_dict().items()]


def get_parameters(model: nn.Module) -> dict[str, np.ndarray]:
    """Float32 numpy copies of the ``state_dict``, in its order (safe to mutate or send)."""
    return {
        name: value.detach().cpu().numpy().astype(np.float32, copy=True) for name, value in model.state_dict().items()
    }


def flatten_parameters(arrays: Mapping[str, np.ndarray]) -> np.ndarray:
    """Named arrays as one float64 vector, in the mapping's (parameter) order."""
    return np.concatenate([np.asarray(a).reshape(-1) for a in arrays.values()]).astype(np.float64)


def unflatten_parameters(vector: np.ndarray, spec: list[tuple[str, tuple[int, ...]]]) -> dict[str, np.ndarray]:
    """A flat vector back into named arrays following `spec` (the inverse of :func:`flatten_parameters`)."""
    sizes = [math.prod(shape) for _, shape in spec]
    if vector.shape != (sum(sizes),):
        raise ValueError(f"vector has shape {vector.shape}, the spec needs ({sum(sizes)},)")
    out, start = {}, 0
    for (name, shape), size in zip(spec, sizes, strict=True):
        out[name] = vector[start : start + size].reshape(shape)
        start += size
    return out


def set_parameters(model: nn.Module, params: Mapping[str, np.ndarray]) -> None:
    """Load ``params`` into ``model`` in place.

    Strict: the names must be exactly those of :func:`parameter_spec`, every shape must match, and every value must be
    finite (a NaN/inf model is never a valid global model and would silently poison a round). Raises ``ValueError``
    naming the offending entries; nothing is modified unless every entry is valid.
    """
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of name -> array, got {type(params).__name__}")
    state = model.state_dict()
    missing = [name for name in state if name not in params]
    unexpected = [name for name in params if name not in state]
    if missing or unexpected:
        raise ValueError(
            f"parameter names do not match the model: missing {missing}, unexpected {unexpected}; "
            f"expected exactly {list(state)}"
        )
    converted: dict[str, torch.Tensor] = {}
    for name, target in state.items():
        try:
            array = np.asarray(params[name], dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"parameter {name!r} is not a numeric array: {exc}") from exc
        if array.shape != tuple(target.shape):
            raise ValueError(
                f"parameter {name!r} has shape {array.shape}, expected {tuple(target.shape)}; "
                "the sender built a different architecture (check kind, num_features, num_labels, hidden)"
            )
        if not np.all(np.isfinite(array)):
            raise ValueError(f"parameter {name!r} contains NaN or inf values")
        converted[name] = torch.from_numpy(array)
    with torch.no_grad():
        for name, target in state.items():
            target.copy_(converted[name])


def clip_factors(norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``min(1, C / norm)`` per row; exactly 1 for rows within the bound (and for zero rows), so a row of norm <= C
    is left bit-for-bit unchanged (no epsilon in the denominator, unlike Opacus' ``C / (||g|| + 1e-6)``); exactly 0
    for a row whose norm is not finite (NaN, or inf: a NaN or inf entry, or finite entries whose norm overflowed).

    Shared by DP-SGD's per-sample clipping (`client.gradients`) and SteFFLe's fairness gradients
    (`protocols.steffle.theta`).

    Why 0: the accounting (add/remove and replace-one alike) needs every record's term in the ball of radius C around
    0, and a term that is not finite is in no ball. The old rule kept a NaN norm's factor at 1, and the factor 0 of an
    inf norm times an inf entry is NaN, so a server that sent huge (finite) parameters made the noised release NaN
    exactly when the record that overflowed was there; noise hides no NaN. Mapping such a record to 0, the centre of
    the ball (what an unsampled record contributes), is a fixed map into the ball, decided from the record's own term
    alone. A factor of 0 does not make a non-finite row 0 (0 x inf is NaN): callers leave those rows out of the sum
    (:func:`clipped_row_sum`, :func:`linear_stack_clipped_sum`).
    """
    # where(norm > C): the division only matters where norm > C > 0, so it never divides by zero; (norm <= C) is 1
    # for the rows within the bound and 0 for a NaN norm (an inf norm takes the first branch: C / inf = 0); `where`
    # promotes it to the norms' dtype.
    return torch.where(norms > clip_norm, clip_norm / norms, norms <= clip_norm)


def all_finite(t: torch.Tensor) -> bool:
    """Whether every entry of ``t`` is finite, from its sum first: a NaN or inf entry makes the sum NaN or inf, so a
    finite sum settles it in one reduction (about a quarter of ``torch.isfinite(t).all()``'s time on a CPU, where the
    per-round math is a few hundred such calls); only a sum that is not finite (a NaN or inf entry, or finite entries
    whose sum overflows) is checked entry by entry. For the masks of the rare batches with a non-finite term."""
    return math.isfinite(float(t.detach().sum())) or bool(torch.isfinite(t).all())


def clipped_row_sum(rows: list[torch.Tensor], norms: torch.Tensor, clip_norm: float) -> torch.Tensor:
    """``sum_i clip(g_i, C)`` flat, from per-record rows split into column blocks (``rows[k]`` ``(n, P_k)``, e.g. one
    per parameter) and each record's norm over all its blocks ``norms (n,)``: ``cat_k(factors @ rows[k])``.

    A record whose norm is not finite is left out of the sum (it contributes exactly 0; :func:`clip_factors` says
    why). A finite norm means finite entries, so every other record's term is clipped and summed as before, bit for
    bit, and when every norm is finite this is the plain ``factors @ rows[k]`` (one check of the ``n`` norms,
    :func:`all_finite`; the rows are copied only in the rare batch that has such a record)."""
    factors = clip_factors(norms, clip_norm)
    if not all_finite(norms):
        keep = torch.isfinite(norms)
        factors, rows = factors[keep], [r[keep] for r in rows]
    return torch.cat([factors @ r for r in rows])


def linear_stack_clipped_sum(
    model: TabularModel, x: torch.Tensor, total: Callable[[torch.Tensor], torch.Tensor], clip_norm: float
) -> torch.Tensor:
    """``sum_i clip(grad_theta t_i, C)`` as a flat ``(P,)`` vector (parameter order), where ``total(logits)`` returns
    ``sum_i t_i`` and record i's term ``t_i`` depends only on record i's logits; no ``vmap``.

    For a Linear layer with input rows ``a_i`` and output gradients ``delta_i`` the per-sample gradients are
    ``delta_i a_i^T`` (weight) and ``delta_i`` (bias): their squared norm is ``|delta_i|^2 (|a_i|^2 + 1)`` and the
    clipped sum is ``(f * delta)^T a`` and ``f^T delta`` with the clip factors ``f``. One backward pass of the total
    gives every ``delta_i``, at a fraction of ``vmap(grad)``'s per-call dispatch (~0.1-0.2 vs ~0.6-0.7 ms at m = 256,
    d = 102). Why our own: DP-FedSGD, SteFFLe and DP-mu2-FL take one step per round over thousands of rounds. Used by
    `client.gradients` (the loss) and `protocols.steffle.theta` (the fairness term); tests check both against
    ``torch.func``.

    A record whose per-sample gradient (or its norm) is not finite, e.g. under huge parameters from the server,
    contributes exactly 0 (:func:`clip_factors`); the forward and backward passes are row by row, so its inf or NaN
    stays in its own rows.
    """
    layers = [layer for layer in (model.hidden, model.head) if layer is not None]
    if x.shape[1] != layers[0].in_features:
        raise ValueError(
            f"x has {x.shape[1]} features but the model was built with num_features={layers[0].in_features}"
        )
    inputs, outputs = [], []
    h = x
    with torch.enable_grad():
        for index, layer in enumerate(layers):
            pre = F.linear(h, layer.weight.detach(), layer.bias.detach())
            if index == 0:
                pre.requires_grad_(True)
            inputs.append(h.detach())
            outputs.append(pre)
            h = torch.relu(pre) if index < len(layers) - 1 else pre
        deltas = torch.autograd.grad(total(model.to_logits(h)), outputs)
    return _clipped_sum_of_layers(inputs, list(deltas), clip_norm)


def _clipped_sum_of_layers(inputs: list[torch.Tensor], deltas: list[torch.Tensor], clip_norm: float) -> torch.Tensor:
    """Per Linear layer its input rows ``a_i`` and output gradients ``delta_i``: the clipped sum of the per-sample
    gradients ``delta_i a_i^T``, ``delta_i`` (see :func:`linear_stack_clipped_sum`).

    A record whose squared norm ``sum |delta_i|^2 (|a_i|^2 + 1)`` is not finite is left out (it contributes exactly
    0: :func:`clip_factors`). That norm is finite only if every ``a_i`` and ``delta_i`` of the record is (a non-finite
    entry makes its factor inf or NaN, and ``0 x inf`` is NaN), so the records kept have finite rows; with every norm
    finite the sum is computed exactly as before."""
    sq_norms = sum(
        torch.linalg.vector_norm(d, dim=1) ** 2 * (torch.linalg.vector_norm(a, dim=1) ** 2 + 1.0)
        for a, d in zip(inputs, deltas, strict=True)
    )
    norms = torch.sqrt(sq_norms)
    factors = clip_factors(norms, clip_norm)
    if not all_finite(norms):  # rare: copy only the finite records' rows
        keep = torch.isfinite(norms)
        factors = factors[keep]
        inputs, deltas = [a[keep] for a in inputs], [d[keep] for d in deltas]
    parts = []
    for a, d in zip(inputs, deltas, strict=True):
        scaled = d * factors.unsqueeze(1)
        parts += [(scaled.T @ a).reshape(-1), scaled.sum(0)]
    return torch.cat(parts)


def _check_head_only(model: TabularModel, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if model.hidden is not None:
        raise ValueError("the closed-form head routes are for logistic regression (a model without a hidden layer)")
    if x.shape[1] != model.head.in_features:
        raise ValueError(
            f"x has {x.shape[1]} features but the model was built with num_features={model.head.in_features}"
        )
    return model.head.weight.detach(), model.head.bias.detach()


def head_clipped_sum(
    model: TabularModel,
    x: torch.Tensor,
    logit_grads: Callable[[torch.Tensor], torch.Tensor],
    clip_norm: float,
) -> torch.Tensor:
    """:func:`linear_stack_clipped_sum` for logistic regression (no hidden layer) when ``d total / d logits`` has a
    closed form: ``logit_grads(logits)`` returns it ``(n, l)`` (row i: ``d t_i / d logits_i``). No autograd graph and
    no backward pass (the engine's fixed cost is most of a small batch's time); with ``logit_grads`` computed by the
    kernels autograd runs for the same total, the result is autograd's route's, bit for bit (tests compare them)."""
    weight, bias = _check_head_only(model, x)
    delta = model.head_output_grads(logit_grads(model.to_logits(F.linear(x, weight, bias))))
    return _clipped_sum_of_layers([x.detach()], [delta], clip_norm)


def head_gradient(model: TabularModel, x: torch.Tensor, logit_grads: torch.Tensor) -> torch.Tensor:
    """The gradient of a total over the batch w.r.t. a logistic regression's parameters, flat (parameter order), from
    ``d total / d logits`` ``(n, l)``: ``delta^T x`` (weight) and ``sum_i delta_i`` (bias), computed as autograd's
    backward of the head's ``addmm`` computes them (same kernels, same bits; tests compare them)."""
    _check_head_only(model, x)
    delta = model.head_output_grads(logit_grads)
    return torch.cat([delta.t().mm(x).reshape(-1), delta.sum(0)])


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits (n, l)`` against integer ``labels (n,)``.

    For the binary head this equals BCE-with-logits on ``z`` (see module docstring).
    """
    return F.cross_entropy(logits, labels)


@torch.no_grad()
def test_outputs(model: nn.Module, features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, float, np.ndarray]:
    """A model on a test split: each record's predicted label, the summed loss (the mean loss times n, as every
    evaluation reports it) and each record's loss (float64, for a noised evaluation's clipping)."""
    device = model_device(model)  # the CPU unless the run asked for a device: then the forward pass runs there
    x, y = torch.from_numpy(features).to(device), torch.from_numpy(labels).to(device)
    logits = model(x)
    loss_sum = float(loss_fn(logits, y)) * len(y) if len(y) else 0.0
    losses = F.cross_entropy(logits, y, reduction="none").cpu().numpy().astype(np.float64)
    return logits.argmax(dim=1).cpu().numpy(), loss_sum, losses


@torch.no_grad()
def predict(model: nn.Module, x: np.ndarray | torch.Tensor) -> np.ndarray:
    """Predicted labels (int64 argmax of the logits) for a batch ``(n, num_features)``.

    For the binary head this is ``sigmoid(z) > 0.5``; a tie ``z == 0`` goes to label 0.
    """
    tensor = torch.as_tensor(x, dtype=torch.float32)
    if tensor.ndim != 2:
        raise ValueError(f"x must be 2-D (n, num_features), got shape {tuple(tensor.shape)}")
    return model(tensor.to(model_device(model))).argmax(dim=1).cpu().numpy().astype(np.int64)
