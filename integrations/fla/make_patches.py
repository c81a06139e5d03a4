"""Build the Selective RoPE patch series against flash-linear-attention 0.6.0 from srope's own sources.

One source of truth: the kernels, their launches, the float64 reference and the temperature spectra are taken from
srope's modules (``src/srope/...``) by name, renamed to fla's vocabulary and given fla's header; only the fla-side glue
(the ``autograd.Function`` and public signatures, the module, the tests, the benchmark entry) is written by hand, under
``templates/``, and the few lines added to fla's existing files are the ``EDITS`` below. The patches are ``git
format-patch`` files made in a scratch git repository from a pristine fla tree, with fixed author and dates, so the
same inputs give the same bytes; ``tests/integrations/test_fla_patch.py`` regenerates them and compares.

    python integrations/fla/make_patches.py --fla-src DIR      # DIR holds fla 0.6.0's fla/ tree (default: installed)
    python integrations/fla/make_patches.py --check            # exit 1 when patches/ differs from what it would write
    python integrations/fla/make_patches.py --tree OUT         # also write the patched fla/ tree (for reading)
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import tokenize
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SRC = ROOT / "src"
TEMPLATES = HERE / "templates"
PATCHES = HERE / "patches"
FLA_VERSION = "0.6.0"
DISTRIBUTIONS = ("fla-core", "flash-linear-attention")
MAX_LINE = 127  # fla's flake8 limit

HEADER = """\
# Copyright (c) 2023-2026, Songlin Yang, Yu Zhang, Zhiyuan Li
#
# This source code is licensed under the MIT license found in the
# LICENSE file in the root directory of this source tree.
# For a list of all contributors, visit:
#   https://github.com/fla-org/flash-linear-attention/graphs/contributors
#
# Selective RoPE: generated from the srope library's sources by its integrations/fla/make_patches.py."""

# srope's words -> fla's, applied to every extracted block (order matters: longer names first).
RENAMES = (
    ("SROPE_PDL", "FLA_SELECTIVE_ROPE_PDL"),
    ("srope_fwd_kernel", "selective_rope_fwd_kernel"),
    ("srope_bwd_kernel", "selective_rope_bwd_kernel"),
    ("``srope_fwd``", "``selective_rope_fwd_kernel``"),
    ("``srope_bwd``", "``selective_rope_bwd_kernel``"),
    ("of srope's kernels", "of the Selective RoPE kernels"),
    (":func:`srope.ops._triton.pdl`", "``pdl`` in chunk.py"),
    ("docs/kernels.md", "srope's docs/kernels.md"),
    # the generator's projection: its kernels are in the same file, and fla's switch is the device (generator.py)
    ("            from srope.ops.generator.projection_kernels import projection_forward\n\n", ""),
    ("            from srope.ops.generator.projection_kernels import projection_backward\n\n", ""),
    ("x.is_cuda and x.dtype == torch.float32 and backend.kernels(x)", "x.dtype == torch.float32 and _kernels(x)"),
    ("low and x.is_cuda and ctx.x_dtype == torch.float32 and backend.kernels(x)", "low and ctx.x_dtype == torch.float32 and _kernels(x)"),
    (":func:`srope.ops.generator.projection.normalized_head_projection`", "``normalized_head_projection``"),
    ("# the conv's (srope.ops.conv.ACTIVATIONS)", "# ShortConvolution's"),
    ("(:meth:`ShortConvolution.kernel`)", "(``ShortConvolution.weight[:, 0]``)"),
    (":func:`apply_head_gate`", "srope's ``apply_head_gate``"),
)

# Names left out of the kernel module: srope's fixed-RoPE kernels (fla has its own rotary).
KERNELS_LEFT_OUT = {"rope_fwd_kernel", "rope_bwd_kernel", "_rope_angles"}
# Decorators that belong to srope's torch.library registration (KernelOp), not to the functions.
DROPPED_DECORATORS = ("kernel_op", "_guarded")


class Step:
    """One patch of the series: its subject, the template files it adds and the edits it makes."""

    def __init__(self, subject: str, body: str, files: tuple[str, ...], edits: tuple[tuple[str, str, str], ...] = ()):
        self.subject, self.body, self.files, self.edits = subject, body, files, edits


_GLA_STATE = (
    "        conv_state = (conv_state_q, conv_state_k, conv_state_v) if self.use_short_conv else None\n"
    "        if self.rotary is not None:  # the Selective RoPE state rides as the 4th element of conv_state\n"
    "            conv_state = (*(conv_state or (None,) * 3), rope_state)\n"
)
_ROTARY_CALL = (
    "        rope_state = None\n"
    "        if self.rotary is not None:\n"
    "            q, k, rope_state = self.rotary(\n"
    "                q, k, hidden_states, cu_seqlens=cu_seqlens, output_final_state=use_cache,\n"
    "                initial_state=last_state['conv_state'][3] if last_state is not None else None,\n"
    "            )\n"
)
_OPTION_ARGS = "        use_selective_rope: bool = False,\n        selective_rope: dict | None = None,\n"
_OPTION_DOC = (
    "        use_selective_rope (bool, Optional):\n"
    "            Whether to rotate q and k with `SelectiveRotaryEmbedding` (angles from the hidden states). Default: `False`.\n"
    "        selective_rope (dict, Optional):\n"
    "            Keyword arguments of `SelectiveRotaryEmbedding` (projection, gate, bias, spectrum, ...). Default: `None`.\n"
)
_ROTARY_INIT = (
    "        self.rotary = SelectiveRotaryEmbedding(hidden_size, num_heads, self.head_k_dim, **(selective_rope or {})) \\\n"
    "            if use_selective_rope else None\n"
)
_IMPORT = "from fla.modules.selective_rotary import SelectiveRotaryEmbedding\n"
_CONFIG_ARGS = ("        **kwargs,\n    ):\n", _OPTION_ARGS + "        **kwargs,\n    ):\n")
_CONFIG_SET = ("        self.attnres_block_size = attnres_block_size\n",
               "        self.attnres_block_size = attnres_block_size\n"
               "        self.use_selective_rope = use_selective_rope\n        self.selective_rope = selective_rope\n")
_MODEL_ARGS = ("                use_selective_rope=config.use_selective_rope,\n"
               "                selective_rope=config.selective_rope,\n")

SERIES = (
    Step(
        "ops: add the selective_rope op family",
        "chunk_selective_rope (training and prefill, forward and backward), fused_recurrent_selective_rope (decoding)\n"
        "and naive_selective_rope (the float64 reference): q and k rotated by input-dependent cumulative angles.\n"
        "GQA, partial rotary, cu_seqlens / chunk_indices, float64 phase state (initial_state / output_final_state).\n",
        ("fla/ops/selective_rope/__init__.py", "fla/ops/selective_rope/chunk.py", "fla/ops/selective_rope/fused_recurrent.py",
         "fla/ops/selective_rope/kernels.py", "fla/ops/selective_rope/naive.py"),
        (
            ("fla/ops/__init__.py", "from .rwkv7 import chunk_rwkv7, fused_recurrent_rwkv7\n",
             "from .rwkv7 import chunk_rwkv7, fused_recurrent_rwkv7\n"
             "from .selective_rope import chunk_selective_rope, fused_recurrent_selective_rope\n"),
            ("fla/ops/__init__.py", "    'chunk_rwkv7',\n", "    'chunk_rwkv7',\n    'chunk_selective_rope',\n"),
            ("fla/ops/__init__.py", "    'fused_recurrent_rwkv7',\n",
             "    'fused_recurrent_rwkv7',\n    'fused_recurrent_selective_rope',\n"),
        ),
    ),
    Step(
        "modules: add SelectiveRotaryEmbedding",
        "The angle generator (per-head l2-normalised hidden states, projection, short convolution, bias, phase gate)\n"
        "and the rotation, called as q, k, state = rotary(q, k, x, cu_seqlens=..., initial_state=..., output_final_state=...).\n"
        "On GPUs the generator runs fused kernels (fla/ops/selective_rope/generator.py): the normalised projection in one\n"
        "pass over x, and the convolution with the gate and bias in one kernel forward and two backward.\n",
        ("fla/modules/selective_rotary.py", "fla/ops/selective_rope/generator.py"),
        (
            ("fla/modules/__init__.py", "from fla.modules.rotary import RotaryEmbedding\n",
             "from fla.modules.rotary import RotaryEmbedding\n" + _IMPORT),
            ("fla/modules/__init__.py", "    'RotaryEmbedding',\n", "    'RotaryEmbedding',\n    'SelectiveRotaryEmbedding',\n"),
        ),
    ),
    Step(
        "layers, models: use_selective_rope in GLA and Gated DeltaNet",
        "An option of GatedLinearAttention and GatedDeltaNet and of their model configs; off by default, so existing\n"
        "configs and checkpoints are unchanged. The rotary state is kept as a 4th element of the layer's conv_state.\n",
        (),
        (
            ("fla/layers/gla.py", "from fla.modules.activations import ACT2FN\n", "from fla.modules.activations import ACT2FN\n" + _IMPORT),
            ("fla/layers/gla.py", "        layer_idx (int, Optional):\n            The index of the layer. Default: None.\n",
             _OPTION_DOC + "        layer_idx (int, Optional):\n            The index of the layer. Default: None.\n"),
            ("fla/layers/gla.py", "        fuse_norm: bool = True,\n        layer_idx: int = None,\n",
             "        fuse_norm: bool = True,\n" + _OPTION_ARGS + "        layer_idx: int = None,\n"),
            ("fla/layers/gla.py", "        self.gate_logit_normalizer = gate_logit_normalizer\n",
             "        self.gate_logit_normalizer = gate_logit_normalizer\n" + _ROTARY_INIT),
            ("fla/layers/gla.py", "                conv_state_q, conv_state_k, conv_state_v = last_state['conv_state']\n",
             "                conv_state_q, conv_state_k, conv_state_v = last_state['conv_state'][:3]\n"),
            ("fla/layers/gla.py", "            q, k = map(self.feature_map_fn, (q, k))\n",
             "            q, k = map(self.feature_map_fn, (q, k))\n" + _ROTARY_CALL),
            ("fla/layers/gla.py", "        update_layer_cache(\n", _GLA_STATE + "        update_layer_cache(\n"),
            ("fla/layers/gla.py", "            conv_state=(conv_state_q, conv_state_k, conv_state_v) if self.use_short_conv else None,\n",
             "            conv_state=conv_state,\n"),
            ("fla/layers/gated_deltanet.py", "from fla.modules.convolution import causal_conv1d\n",
             "from fla.modules.convolution import causal_conv1d\n" + _IMPORT),
            ("fla/layers/gated_deltanet.py", "        output_gate_activation: str = 'swish',\n        **kwargs,\n",
             "        output_gate_activation: str = 'swish',\n" + _OPTION_ARGS + "        **kwargs,\n"),
            ("fla/layers/gated_deltanet.py", "        self.o_proj = nn.Linear(in_features=self.value_dim, out_features=hidden_size, bias=False)\n",
             "        self.o_proj = nn.Linear(in_features=self.value_dim, out_features=hidden_size, bias=False)\n" + _ROTARY_INIT),
            ("fla/layers/gated_deltanet.py", "                conv_state_q, conv_state_k, conv_state_v = last_state['conv_state']\n",
             "                conv_state_q, conv_state_k, conv_state_v = last_state['conv_state'][:3]\n"),
            ("fla/layers/gated_deltanet.py", "        v = rearrange(v, '... (h d) -> ... h d', d=self.head_v_dim)\n",
             "        v = rearrange(v, '... (h d) -> ... h d', d=self.head_v_dim)\n" + _ROTARY_CALL),
            ("fla/layers/gated_deltanet.py", "        update_layer_cache(\n", _GLA_STATE + "        update_layer_cache(\n"),
            ("fla/layers/gated_deltanet.py",
             "            conv_state=(conv_state_q, conv_state_k, conv_state_v) if self.use_short_conv else None,\n",
             "            conv_state=conv_state,\n"),
            ("fla/models/gla/configuration_gla.py", *_CONFIG_ARGS),
            ("fla/models/gla/configuration_gla.py", *_CONFIG_SET),
            ("fla/models/gated_deltanet/configuration_gated_deltanet.py", *_CONFIG_ARGS),
            ("fla/models/gated_deltanet/configuration_gated_deltanet.py", *_CONFIG_SET),
            ("fla/models/gla/modeling_gla.py", "                fuse_norm=config.fuse_norm,\n                layer_idx=layer_idx,\n",
             "                fuse_norm=config.fuse_norm,\n" + _MODEL_ARGS + "                layer_idx=layer_idx,\n"),
            ("fla/models/gated_deltanet/modeling_gated_deltanet.py",
             "                output_gate_activation=config.output_gate_activation,\n",
             "                output_gate_activation=config.output_gate_activation,\n" + _MODEL_ARGS),
        ),
    ),
    Step(
        "tests, benchmarks: selective_rope",
        "tests/ops/test_selective_rope.py (test_chunk, test_chunk_varlen, test_fused_recurrent against the naive reference;\n"
        "test_module_generator: the module's fused generator against float64)\n"
        "and the benchmark registry entry of chunk_selective_rope (import it from benchmarks/ops/registry.py).\n",
        ("tests/ops/test_selective_rope.py", "benchmarks/ops/registry_selective_rope.py"),
    ),
)


# --------------------------------------------------------------------------- extraction from srope


def _module_path(module: str) -> Path:
    return SRC.joinpath(*module.split(".")).with_suffix(".py")


def _node_name(node: ast.stmt) -> str | None:
    if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _block(lines: list[str], node: ast.stmt) -> str:
    """A top-level statement's text with the comment lines right above it, less srope's registration decorators."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while first > 0 and lines[first - 1].startswith("#"):
        first -= 1
    text = lines[first:node.end_lineno]
    kept = [line for line in text if not any(line.startswith("@" + name) for name in DROPPED_DECORATORS)]
    return "\n".join(kept)


def extract(module: str, names: list[str] | None = None, leave_out: set[str] = frozenset()) -> str:
    """The named top-level definitions of srope module ``module`` in source order (all but ``leave_out`` when
    ``names`` is None, imports excluded)."""
    source = _module_path(module).read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    found, blocks = set(), []
    for node in tree.body:
        name = _node_name(node)
        if names is None:
            if name is None or name in leave_out or name == "__future__":
                continue
        elif name not in names:
            continue
        found.add(name)
        blocks.append(_block(lines, node))
    missing = set(names or ()) - found
    if missing:
        raise ValueError(f"{module} has no top-level {sorted(missing)}: update make_patches.py")
    return "\n\n\n".join(blocks)


def _kernel_module() -> str:
    """srope's kernels module as fla's ``kernels.py``: its docstring and imports, ``await_predecessor`` inlined."""
    source = _module_path("srope.ops.rotary.kernels").read_text(encoding="utf-8")
    tree = ast.parse(source)
    lines = source.splitlines()
    doc = "\n".join(lines[tree.body[0].lineno - 1:tree.body[0].end_lineno])
    imports = "\n".join(
        "\n".join(lines[node.lineno - 1:node.end_lineno]) for node in tree.body
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not (isinstance(node, ast.ImportFrom) and node.module in (
            "__future__", "srope.ops._triton"))
    )
    imports += "\nfrom triton.language.extra.cuda import gdc_launch_dependents, gdc_wait"
    body = extract("srope.ops._triton", ["await_predecessor"]) + "\n\n\n" + extract(
        "srope.ops.rotary.kernels", None, KERNELS_LEFT_OUT)
    return f"{doc}\n\n{imports}\n\n{body}\n"


# --------------------------------------------------------------------------- rendering


_RENAMED: set[str] = set()  # the RENAMES that matched in this build (every one must: see build)


def _rename(text: str) -> str:
    for old, new in RENAMES:
        if old in text:
            _RENAMED.add(old)
        text = text.replace(old, new)
    return text


def _wrap_line(line: str, depth: int = 0) -> list[str]:
    """Split a too-long line inside brackets at the last ', ' that fits (Python joins bracketed lines); ``depth``: the
    brackets open before the line starts (a continuation line)."""
    if len(line) <= MAX_LINE:
        return [line]
    indent = len(line) - len(line.lstrip())
    cut = line.rfind(", ", 0, MAX_LINE - 1)
    head = line[:cut]
    inside_brackets = depth + head.count("(") + head.count("[") > head.count(")") + head.count("]")
    inside_string = head.count('"') % 2 or head.count("'") % 2
    if line.lstrip().startswith("#") or cut <= indent or not inside_brackets or inside_string:
        raise ValueError(f"cannot wrap this line to {MAX_LINE} characters:\n{line}")
    return [line[:cut + 1]] + _wrap_line(" " * (indent + 4) + line[cut + 2:], depth)


def render(template: str) -> str:
    """A template's text with its ``# @header`` and ``# @srope MODULE NAMES...`` lines filled in."""
    out = []
    for line in template.splitlines():
        if line == "# @header":
            out.append(HEADER)
        elif line.startswith("# @srope-module "):
            out.append(_wrap(_rename(_kernel_module()).rstrip("\n")))
        elif line.startswith("# @srope "):
            module, *names = line.split()[2:]
            # NAME:ALIAS takes NAME and defines it as ALIAS (srope's public name kept private in fla's file)
            aliases = dict(name.split(":") for name in names if ":" in name)
            text = extract(module, [name.split(":")[0] for name in names])
            for name, alias in aliases.items():
                text = edit(text, f"def {name}(", f"def {alias}(", module)
            out.append(_wrap(_rename(text)))
        elif len(line) > MAX_LINE:
            raise ValueError(f"template line longer than {MAX_LINE} characters:\n{line}")
        else:
            out.append(line)
    text = "\n".join(out).rstrip("\n") + "\n"
    tree = ast.parse(text)  # the generated file must still be Python
    names = [_node_name(node) for node in tree.body if _node_name(node) is not None]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:  # two extracted modules defining one name: the later would silently replace the earlier
        raise ValueError(f"names defined twice in one generated file: {twice}")
    code = ast.unparse(tree)  # without comments: srope's imports or backend switch left in code would fail in fla
    if "srope." in code.replace("srope's", "") or "backend.kernels" in code or "kernel_op(" in code:
        raise ValueError("srope code left in a generated file (a RENAMES entry no longer matches srope's source?)")
    return text


def _opening_depths(text: str) -> dict[int, int]:
    """For each line (1-based) that starts inside brackets, how many are open there."""
    depths, depth = {}, 0
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.OP and token.string in "([{":
            depth += 1
        elif token.type == tokenize.OP and token.string in ")]}":
            depth -= 1
        elif token.type in (tokenize.NL, tokenize.NEWLINE) and depth:
            depths[token.start[0] + 1] = depth
    return depths


def _wrap(text: str) -> str:
    depths = _opening_depths(text)
    wrapped = "\n".join(piece for number, line in enumerate(text.split("\n"), 1) for piece in _wrap_line(line, depths.get(number, 0)))
    if ast.dump(ast.parse(wrapped)) != ast.dump(ast.parse(text)):  # e.g. a cut inside a string's text
        raise ValueError("wrapping to 127 characters changed the code: wrap the long line in srope's source")
    return wrapped


def edit(text: str, anchor: str, replacement: str, path: str) -> str:
    count = text.count(anchor)
    if count != 1:
        raise ValueError(f"{path}: expected the anchor once, found it {count} times:\n{anchor}")
    return text.replace(anchor, replacement)


# --------------------------------------------------------------------------- fla's sources and the series


def installed_fla() -> Path:
    """The site folder holding the installed fla 0.6.0 tree (both distributions), checked by version."""
    roots = set()
    for name in DISTRIBUTIONS:
        dist = importlib.metadata.distribution(name)
        if dist.version != FLA_VERSION:
            raise ValueError(f"{name} {dist.version} is installed; the series is made against {FLA_VERSION}")
        roots.add(Path(dist.locate_file("")))
    if len(roots) != 1:
        raise ValueError(f"fla-core and flash-linear-attention are installed in different places: {sorted(roots)}")
    return roots.pop()


def _git(repo: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="srope", GIT_AUTHOR_EMAIL="srope@users.noreply.github.com",
               GIT_COMMITTER_NAME="srope", GIT_COMMITTER_EMAIL="srope@users.noreply.github.com",
               GIT_AUTHOR_DATE="2026-01-01T00:00:00Z", GIT_COMMITTER_DATE="2026-01-01T00:00:00Z",
               GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env).stdout


def touched_files() -> list[str]:
    return sorted({path for step in SERIES for path, *_ in step.edits})


def build(fla_src: Path, out: Path, tree: Path | None = None) -> list[Path]:
    """Write the series into ``out`` (and the patched files into ``tree``); return the patch paths."""
    with tempfile.TemporaryDirectory() as scratch:
        repo = Path(scratch)
        _git(repo, "init", "-q")
        for path in touched_files():
            (repo / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(fla_src / path, repo / path)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", f"fla {FLA_VERSION} (the files the series edits)")
        for step in SERIES:
            for path in step.files:
                (repo / path).parent.mkdir(parents=True, exist_ok=True)
                (repo / path).write_text(render((TEMPLATES / path).read_text(encoding="utf-8")), encoding="utf-8")
            for path, anchor, replacement in step.edits:
                target = repo / path
                target.write_text(edit(target.read_text(encoding="utf-8"), anchor, replacement, path), encoding="utf-8")
            _git(repo, "add", "-A")
            _git(repo, "commit", "-q", "-m", f"[selective-rope] {step.subject}\n\n{step.body}")
        unused = [old for old, _ in RENAMES if old not in _RENAMED]
        if unused:
            raise ValueError(f"RENAMES entries that match no extracted text (srope's source changed?): {unused}")
        out.mkdir(parents=True, exist_ok=True)
        for old in out.glob("*.patch"):
            old.unlink()
        _git(repo, "format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered", "-o", str(out), f"HEAD~{len(SERIES)}")
        if tree is not None:
            for step in SERIES:
                for path in list(step.files) + [p for p, *_ in step.edits]:
                    (tree / path).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(repo / path, tree / path)
        return sorted(out.glob("*.patch"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fla-src", type=Path, help="a folder holding fla 0.6.0's fla/ tree (default: the installed one)")
    parser.add_argument("--check", action="store_true", help="compare with patches/ instead of writing it")
    parser.add_argument("--tree", type=Path, help="also write the new and edited fla files here")
    args = parser.parse_args(argv)
    fla_src = args.fla_src or installed_fla()
    if not (fla_src / "fla" / "ops" / "__init__.py").is_file():
        parser.error(f"{fla_src} holds no fla/ tree")
    if not args.check:
        for path in build(fla_src, PATCHES, args.tree):
            print(path.relative_to(ROOT))
        return 0
    with tempfile.TemporaryDirectory() as scratch:
        fresh = build(fla_src, Path(scratch))
        committed = sorted(PATCHES.glob("*.patch"))
        stale = [p.name for p in fresh if not (PATCHES / p.name).is_file() or (PATCHES / p.name).read_bytes() != p.read_bytes()]
        extra = sorted({p.name for p in committed} - {p.name for p in fresh})
    if stale or extra:
        print(f"patches/ is out of date ({stale + extra}): run python integrations/fla/make_patches.py", file=sys.stderr)
        return 1
    print(f"patches/ matches srope's sources ({len(fresh)} patches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
