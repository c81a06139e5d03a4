"""The Selective RoPE patch series for flash-linear-attention 0.6.0 (integrations/fla/).

fla's 0.6.0 sources come from the installed ``fla-core`` and ``flash-linear-attention`` 0.6.0
(pinned in requirements-cpu.txt; nothing is downloaded here). The tests copy that tree, apply the
series, and check: it applies cleanly; the committed patches are what make_patches.py writes
from srope's sources now (so they cannot drift from srope's kernels); the patched
``naive_selective_rope`` equals srope's reference op forward and backward in float64; and the
patched chunk and decoding kernels, interpreted by Triton on the CPU, equal it too, and the patched
``SelectiveRotaryEmbedding`` loaded with a srope ``SelectiveRoPE``'s state_dict rotates as it does.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from srope.ops.rotary import selective_rope
from tests.helpers import generator, randn, rel_err

ROOT = Path(__file__).resolve().parents[2]
INTEGRATION = ROOT / "integrations" / "fla"
PATCHES = sorted((INTEGRATION / "patches").glob("*.patch"))
DISTRIBUTIONS = ("fla-core", "flash-linear-attention")


def _load(name: str, path: Path):
    """A module from a file, without touching sys.path (fla's naive files import only torch)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _installed_fla_files() -> list[tuple[Path, Path]]:
    """(site folder, relative path) of every file under fla/ of the two installed 0.6.0 distributions."""
    files = []
    for name in DISTRIBUTIONS:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"{name}==0.6.0 is not installed (requirements-cpu.txt pins it: its sources are the patch base)")
        if dist.version != "0.6.0":
            pytest.skip(f"{name} {dist.version} is installed; the series is made against 0.6.0")
        site = Path(dist.locate_file(""))
        files += [(site, Path(str(f))) for f in dist.files if str(f).startswith("fla/")]
    return files


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fla-0.6.0")
    for site, relative in _installed_fla_files():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(site / relative, root / relative)
    return root


@pytest.fixture(scope="module")
def patched(pristine, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("fla-patched")
    shutil.copytree(pristine, root, dirs_exist_ok=True)
    for patch in PATCHES:
        subprocess.run(["git", "apply", "--whitespace=error-all", str(patch)], cwd=root, check=True, capture_output=True)
    return root


def test_the_series_applies_cleanly_to_fla_0_6_0(pristine, tmp_path):
    assert [p.name[:4] for p in PATCHES] == ["0001", "0002", "0003", "0004"]
    tree = tmp_path / "fla"
    shutil.copytree(pristine, tree)
    for patch in PATCHES:
        result = subprocess.run(["git", "apply", "--check", "--whitespace=error-all", str(patch)], cwd=tree, capture_output=True, text=True)
        assert result.returncode == 0, f"{patch.name}: {result.stderr}"
        subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)
    assert (tree / "fla/ops/selective_rope/chunk.py").is_file() and (tree / "tests/ops/test_selective_rope.py").is_file()
    too_long = [f"{p.relative_to(tree)}:{n}" for p in (tree / "fla").rglob("*selective*") if p.is_file()
                for n, line in enumerate(p.read_text().splitlines(), 1) if len(line) > 127]
    too_long += [f"{p.relative_to(tree)}:{n}" for p in (tree / "fla/ops/selective_rope").glob("*.py")
                 for n, line in enumerate(p.read_text().splitlines(), 1) if len(line) > 127]
    assert not too_long, f"lines over fla's 127 characters: {too_long}"


def test_the_committed_patches_are_what_make_patches_writes_now(pristine, tmp_path):
    """The series is generated from srope's kernels and reference: a change there without
    ``python integrations/fla/make_patches.py`` fails here."""
    make_patches = _load("make_patches", INTEGRATION / "make_patches.py")
    fresh = make_patches.build(pristine, tmp_path)
    assert [p.name for p in fresh] == [p.name for p in PATCHES]
    stale = [p.name for p, q in zip(fresh, PATCHES) if p.read_bytes() != q.read_bytes()]
    assert not stale, f"{stale} differ from srope's sources: run python integrations/fla/make_patches.py"


CASES = {
    "odd-T": dict(batch=2, length=37, heads=2, key_heads=2, dim=16, pairs=8),
    "gqa-partial": dict(batch=1, length=63, heads=4, key_heads=2, dim=16, pairs=5),
    "per-head-temperature": dict(batch=2, length=9, heads=3, key_heads=3, dim=8, pairs=4, head_temperature=True),
    "varlen": dict(batch=1, length=41, heads=2, key_heads=1, dim=12, pairs=6, cu_seqlens=[0, 1, 16, 16, 41]),
}


@pytest.mark.parametrize("name", CASES)
def test_patched_naive_equals_sropes_reference_forward_and_backward(patched, name):
    case = dict(CASES[name])
    naive = _load("fla_selective_rope_naive", patched / "fla/ops/selective_rope/naive.py").naive_selective_rope
    cu_seqlens = case.pop("cu_seqlens", None)
    cu_seqlens = None if cu_seqlens is None else torch.tensor(cu_seqlens, dtype=torch.int64)
    head_temperature = case.pop("head_temperature", False)
    b, t, h, hk, d, r = case.values()
    n = b if cu_seqlens is None else len(cu_seqlens) - 1
    g = generator(sum(map(ord, name)))
    inputs = [
        randn(b, t, h, d, seed_gen=g), randn(b, t, hk, d, seed_gen=g), 0.5 + randn(b, t, hk, r, seed_gen=g, scale=0.5),
        torch.rand((hk, r) if head_temperature else (r,), generator=g, dtype=torch.float64), randn(n, hk, r, seed_gen=g, scale=3.0),
    ]
    grads_out = [randn(b, t, h, d, seed_gen=g), randn(b, t, hk, d, seed_gen=g)]

    def run(fn, state: str, **kwargs):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        q_rot, k_rot, final = fn(*leaves[:4], cu_seqlens=cu_seqlens, **{state: leaves[4]}, **kwargs)
        ((q_rot * grads_out[0]).sum() + (k_rot * grads_out[1]).sum()).backward()
        return [q_rot, k_rot, final] + [x.grad for x in leaves]

    expected = run(selective_rope, "offset", output_final_phase=True, backend="torch")
    actual = run(naive, "initial_state", output_final_state=True)
    for label, a, e in zip(("q", "k", "final", "dq", "dk", "dphi", "dtemperature", "dinitial_state"), actual, expected):
        assert a.dtype == e.dtype and rel_err(a, e) < 1e-13, (label, a.dtype, e.dtype, rel_err(a, e))


KERNEL_CHECK = """
import torch
from fla.ops.selective_rope import chunk_selective_rope, fused_recurrent_selective_rope, naive_selective_rope

def err(a, b):  # relative; absolute against zeros; NaN counts as infinitely wrong (max() would drop it)
    a, b = a.double(), b.double()
    scale = b.norm()
    e = float((a - b).norm() / scale) if scale > 0 else float((a - b).abs().max())
    return e if e == e else float("inf")

torch.manual_seed(0)
worst = 0.0
for (b, t, h, hk, d, r), cu in (((2, 37, 4, 2, 16, 6), None), ((1, 50, 2, 2, 16, 8), [0, 7, 30, 50])):
    cu = None if cu is None else torch.tensor(cu)
    n = b if cu is None else len(cu) - 1
    leaves = [torch.randn(b, t, h, d), torch.randn(b, t, hk, d), 0.5 + 0.5 * torch.randn(b, t, hk, r),
              500000.0 ** -(torch.arange(r) / r), torch.randn(n, hk, r, dtype=torch.float64)]
    dq, dk = torch.randn(b, t, h, d), torch.randn(b, t, hk, d)
    results = []
    for fn in (naive_selective_rope, chunk_selective_rope):
        xs = [x.clone().requires_grad_(True) for x in leaves]
        q, k, ht = fn(*xs[:4], initial_state=xs[4], output_final_state=True, cu_seqlens=cu)
        ((q * dq).sum() + (k * dk).sum()).backward()
        results.append([q, k, ht] + [x.grad for x in xs])
    worst = max([worst] + [err(a, e) for a, e in zip(results[1], results[0])])
q, k, phi, temp, h0 = (x.detach() for x in leaves[:4] + [torch.zeros(1, 2, 8, dtype=torch.float64)])
ref_q, _, ref_ht = chunk_selective_rope(q, k, phi, temp, initial_state=h0, output_final_state=True, cu_seqlens=None)
state, steps = h0, []
for i in range(q.shape[1]):
    q_i, _, state = fused_recurrent_selective_rope(q[:, i:i + 1], k[:, i:i + 1], phi[:, i:i + 1], temp, state)
    steps.append(q_i)
worst = max(worst, err(torch.cat(steps, 1), ref_q), float((state - ref_ht).abs().max()))

# The module with srope's SelectiveRoPE weights: the same state_dict keys, the same rotation. fla's ShortConvolution
# needs a GPU driver even under the interpreter; F.conv1d stands in for it.
import torch.nn.functional as F
from fla.modules import SelectiveRotaryEmbedding
from srope.modules import SelectiveRoPE

def torch_conv(conv):
    def forward(x, cache=None, output_final_state=False, cu_seqlens=None):
        width = conv.weight.shape[-1]
        y = F.conv1d(F.pad(x.transpose(1, 2), (width - 1, 0)), conv.weight, groups=x.shape[-1]).transpose(1, 2)
        return (F.silu(y) if conv.activation else y), None
    conv.forward = forward

# The fused generator's kernels (generator.py) run under the interpreter as on a GPU: count their calls.
import fla.modules.selective_rotary as fla_module
import fla.ops.selective_rope.generator as fla_generator
calls = {}

def counted(owner, name):
    original = getattr(owner, name)
    def call(*args, **kwargs):
        calls[name] = calls.get(name, 0) + 1
        return original(*args, **kwargs)
    setattr(owner, name, call)

for owner, name in ((fla_module, "conv_head_gate"), (fla_generator, "projection_forward"), (fla_generator, "projection_backward")):
    counted(owner, name)

autocast_worst = 0.0
for options, autocast in (({}, False), ({"bias": True, "spectrum": "rfa"}, False),
                          ({"projection": "low-rank", "gate": "per-channel"}, False), ({"bias": True}, True)):
    ours, theirs = SelectiveRoPE(32, 2, 8, **options), SelectiveRotaryEmbedding(32, 2, 8, **options)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.1 * torch.randn_like(p))  # off the zero bias and unit gains of the initialisation
    theirs.load_state_dict(ours.state_dict())
    torch_conv(theirs.conv)
    inputs = (torch.randn(2, 21, 4, 8), torch.randn(2, 21, 2, 8), torch.randn(2, 21, 32))  # q, k, x
    dq, dk = torch.randn(2, 21, 4, 8), torch.randn(2, 21, 2, 8)
    results = []
    for module in (theirs, ours):  # forward, and the backward to q, k, x and every parameter
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            q_rot, k_rot = module(*leaves)[:2]
        ((q_rot * dq).sum() + (k_rot * dk).sum()).backward()
        params = dict(module.named_parameters())
        results.append([q_rot, k_rot] + [t.grad for t in leaves] + [params[name].grad for name in sorted(params)])
    assert sorted(dict(theirs.named_parameters())) == sorted(dict(ours.named_parameters()))
    if autocast:  # the backward's products in bf16, x kept in bf16 by fla's module (srope's keeps it in float32)
        autocast_worst = max([autocast_worst] + [err(a, e) for a, e in zip(*results)])
    else:
        worst = max([worst] + [err(a, e) for a, e in zip(*results)])
    # the temperatures are cached on first use: a first use under inference_mode must not break training afterwards
    fresh = SelectiveRotaryEmbedding(32, 2, 8, **options)
    torch_conv(fresh.conv)
    with torch.inference_mode():
        fresh(*inputs)
    q_rot, k_rot = fresh(inputs[0].clone().requires_grad_(True), *inputs[1:])[:2]
    (q_rot.sum() + k_rot.sum()).backward()

# each option: this module, then a fresh one under inference_mode and training; the fused conv + gate for the standard
# gate's three, the fused projection backward under autocast only
assert calls == {"conv_head_gate": 9, "projection_forward": 12, "projection_backward": 1}, calls
# packed rows, a returned state and a carried state take fla's convolution, never the fused one (it would convolve
# across sequence boundaries and ignore the state); routing only: the F.conv1d stand-in ignores both
theirs = SelectiveRotaryEmbedding(32, 2, 8)
torch_conv(theirs.conv)
q, k, x = torch.randn(1, 21, 4, 8), torch.randn(1, 21, 2, 8), torch.randn(1, 21, 32)
theirs(q, k, x, cu_seqlens=torch.tensor([0, 9, 21]))
theirs(q, k, x, output_final_state=True)
theirs(q, k, x, initial_state=(torch.zeros(1, 16, 4), torch.zeros(1, 2, 4, dtype=torch.float64)))
assert calls["conv_head_gate"] == 9, calls
assert autocast_worst < 2e-2, autocast_worst

# The layer option builds in both models and survives a config round trip (their forward needs fla's GPU kernels).
from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, GLAConfig, GLAForCausalLM
for config_class, model_class, extra in ((GLAConfig, GLAForCausalLM, {}), (GatedDeltaNetConfig, GatedDeltaNetForCausalLM, {"head_dim": 32})):
    config = config_class(hidden_size=64, num_heads=2, num_hidden_layers=1, vocab_size=64, use_selective_rope=True,
                          selective_rope={"bias": True}, **extra)
    config = config_class.from_dict(config.to_dict())
    assert isinstance(model_class(config).model.layers[0].attn.rotary, SelectiveRotaryEmbedding)
    assert model_class(config_class(hidden_size=64, num_heads=2, num_hidden_layers=1, vocab_size=64, **extra)).model.layers[0].attn.rotary is None
print(worst)
"""


@pytest.mark.kernels
def test_patched_kernels_and_module_equal_the_references_under_the_interpreter(patched):
    """The patched chunk and decoding kernels equal the patched naive op, and SelectiveRotaryEmbedding
    loaded with srope's SelectiveRoPE state_dict equals it, forward and backward (q, k, x and every parameter); GLA and
    GDN models build with use_selective_rope.
    fla's package imports need triton
    (interpreted here: TRITON_INTERPRET=1, set for the child process, where the kernels are decorated)."""
    pytest.importorskip("triton")
    pytest.importorskip("einops")  # fla-core's one dependency
    # the patched tree first: it holds every file of fla, so an installed fla later on the path is never reached
    path = os.pathsep.join(p for p in (str(patched), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    result = subprocess.run([sys.executable, "-c", KERNEL_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.split()[-1]) < 1e-5, result.stdout


MAPPING_CHECK = """
import importlib.util
import sys
import tempfile
from pathlib import Path

import torch

from srope.models.convert_fla import srope_key

spec = importlib.util.spec_from_file_location("check_gpu", sys.argv[1])
check_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_gpu)
for options in (check_gpu.PAPER, check_gpu.OTHERS):
    with tempfile.TemporaryDirectory() as folder:
        fla_model, srope_model = check_gpu.fla_and_srope(options, Path(folder))
        theirs, ours = fla_model.state_dict(), srope_model.state_dict()
        names = {key: srope_key(key) for key in theirs}
        assert None not in names.values(), [key for key, name in names.items() if name is None]
        assert sorted(names.values()) == sorted(ours), set(names.values()) ^ set(ours)  # one to one
        assert all(torch.equal(ours[names[key]], tensor) for key, tensor in theirs.items())
        assert any(".attn.rotary." in key for key in theirs) and srope_model.config.position == {"type": "selective_rope", **options}
print("mapped")
"""


def test_check_gpu_maps_every_tensor_of_the_patched_fla_model_once(patched):
    """What integrations/fla/check_gpu.py's logits check compares, built on the CPU: the patched fla's GLAForCausalLM
    with use_selective_rope, saved and converted by srope.models.convert_fla; every fla tensor lands in exactly one
    srope tensor, with its value, and every srope tensor comes from one (the rotary's names carry over as they are).
    fla's models build on the CPU with Triton installed (their forward needs a GPU)."""
    pytest.importorskip("triton")
    pytest.importorskip("einops")
    path = os.pathsep.join(p for p in (str(patched), os.environ.get("PYTHONPATH", "")) if p)
    script = ROOT / "integrations" / "fla" / "check_gpu.py"
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"} | {"PYTHONPATH": path}
    result = subprocess.run([sys.executable, "-c", MAPPING_CHECK, str(script)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-1] == "mapped"
