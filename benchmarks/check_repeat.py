"""Which part of a synthetic task's training step does not repeat itself bitwise on this device.

``experiments/gpu.sh repeat`` showed that two GPU runs of one configuration, seed and data
end with different weights. This script looks inside one step: it builds the model ``srope
synth`` builds (seed 0) and one batch of the task, then runs the runner's loss and backward
``--repeats`` times on the same weights, and compares every module's forward output and
every parameter's gradient and the gradient reaching every module's output with the first
repeat's, bitwise. The first module whose output differs (in the forward pass's order), the
first whose output's gradient differs (in the backward pass's order) and the parameters whose
gradients differ locate the op. A last pass under ``torch.use_deterministic_algorithms(True,
warn_only=True)`` lists the ops PyTorch itself knows to be nondeterministic. The JSON also
holds sha256 digests of the initial weights and of the first repeat's gradients, so that two
processes (two runs of this script) can be compared.

    python benchmarks/check_repeat.py --out out/bench/check_repeat.json
"""

from __future__ import annotations

import argparse
import hashlib
import warnings

import torch

from common import environment, write_json
from srope.lab import provenance, recipes
from srope.lab.cli import srope_model_factory
from srope.lab.tasks import autotune
from srope.lab.tasks.common import rng_for
from srope.lab.tasks.runner import get_task, model_request, resolve_preset, task_loss

# name: (task, preset, overrides): the GLA S2 runs of experiments/gpu.sh, as their recipes hold them
CONFIGS = {r.folder(): (r.task, r.preset, r.settings) for r in map(recipes.load, ("st-gla-s2:srope-demo-encoding", "st-gla-s2:srope", "st-gla-s2:nope"))}


def digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.detach().contiguous().view(-1).view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def first_tensor(output):
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    return getattr(output, "last_hidden_state", None)


def check(task: str, preset: str, overrides: dict, device: torch.device, repeats: int, batch: int | None) -> dict:
    overrides = {**overrides, "train_size": 8192} if task == "state_tracking" else dict(overrides)
    if batch:
        overrides["batch_size"] = batch
    cfg = resolve_preset(task, preset, overrides)
    module = get_task(task)
    setting = module.settings(cfg)[0]
    prepared = module.prepare(cfg, setting, None)
    x_np, y_np = next(iter(prepared.train.epoch(0, rng_for(0, "check_repeat", task))))
    torch.manual_seed(0)
    model = srope_model_factory(model_request(task, cfg, setting)).to(device)
    x, y = torch.as_tensor(x_np, device=device), torch.as_tensor(y_np, device=device)
    loss_of = task_loss(model, setting.vocab_size, device)
    names = {m: n for n, m in model.named_modules()}
    order: list[str] = []
    outputs: dict[str, torch.Tensor] = {}
    output_grads: dict[str, torch.Tensor] = {}  # the gradient reaching each module's output

    def hook(mod, _inputs, output):
        t = first_tensor(output)
        if t is not None:
            order.append(names[mod])
            outputs[names[mod]] = t.detach().clone()
            if t.requires_grad:
                t.register_hook(lambda g, name=names[mod]: output_grads.__setitem__(name, g.detach().clone()))

    handles = [m.register_forward_hook(hook) for m in model.modules() if m is not model]
    passes = []
    for _ in range(repeats):
        order.clear(), outputs.clear(), output_grads.clear()
        model.zero_grad(set_to_none=True)
        torch.manual_seed(1)  # phase noise and dropout draw the same numbers in every repeat
        loss = loss_of(x, y)
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        passes.append((loss.item(), list(order), dict(outputs), grads, dict(output_grads)))
    for h in handles:
        h.remove()
    first_loss, first_order, first_out, first_grads, first_out_grads = passes[0]
    result = {"batch": list(x.shape), "parameters": sum(p.numel() for p in model.parameters()),
              "init_weights": digest(p for _, p in sorted(model.state_dict().items())),
              "first_grads": digest(g for _, g in sorted(first_grads.items())), "losses": [p[0] for p in passes], "repeats": []}
    for loss, order_r, out_r, grads_r, out_grads_r in passes[1:]:
        differ = [n for n in order_r if n in first_out and not torch.equal(out_r[n], first_out[n])]
        # in the order the backward pass reaches them: the last module of the forward first
        grad_of_output_differs = [n for n in reversed(order_r) if n in first_out_grads and not torch.equal(out_grads_r[n], first_out_grads[n])]
        grad_differ = sorted(n for n in first_grads if not torch.equal(grads_r[n], first_grads[n]))
        result["repeats"].append({"loss_equal": loss == first_loss, "same_module_order": order_r == first_order,
                                  "first_output_that_differs": differ[0] if differ else None, "outputs_that_differ": differ[:20],
                                  "first_output_grad_that_differs": grad_of_output_differs[0] if grad_of_output_differs else None,
                                  "output_grads_that_differ": grad_of_output_differs[:20], "grads_that_differ": grad_differ,
                                  "largest_grad_difference": max((float((grads_r[n].float() - first_grads[n].float()).abs().max()) for n in grad_differ),
                                                                 default=0.0)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.use_deterministic_algorithms(True, warn_only=True)
        try:
            model.zero_grad(set_to_none=True)
            loss_of(x, y).backward()
        finally:
            torch.use_deterministic_algorithms(False)
    result["nondeterministic_ops_torch_knows"] = sorted({str(w.message).split("\n")[0][:200] for w in caught if "deterministic" in str(w.message)})
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(CONFIGS), help="configurations (default: all)")
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--batch", type=int, default=None, help="a smaller batch than the protocol's (for a CPU smoke run)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.repeats < 2:
        parser.error("--repeats must be at least 2")
    device = torch.device(args.device)
    mode = autotune.apply()  # as srope synth: $SROPE_AUTOTUNE (experiments/gpu.sh runs with first)
    results, source = {}, provenance.commit()
    for name in args.only or CONFIGS:
        results[name] = check(*CONFIGS[name], device, args.repeats, args.batch)
        print(name, results[name], flush=True)
        write_json(args.out, {"provenance": provenance.record(source=source, autotune=mode), "environment": environment(), "configs": results})


if __name__ == "__main__":
    main()
