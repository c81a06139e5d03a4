"""``srope convert --from-fla DIR OUT``: an fla 0.6.0 GLA checkpoint as an srope model folder
(the mapping: :mod:`srope.models.convert_fla`). Registering it imports nothing heavy."""

from __future__ import annotations

import argparse
import json


def add_convert_command(commands) -> None:
    convert = commands.add_parser(
        "convert", help="an fla 0.6.0 GLAForCausalLM checkpoint as an srope model folder",
        description="Map an fla GLAForCausalLM folder (config.json + safetensors) onto srope's GLA model and save it "
        "(with the folder's tokenizer files). fla's GLA is NoPE; --position rope or selective_rope adds that encoding "
        "(Selective RoPE's parameters freshly initialised: fine-tune before use). Config fields or tensors srope "
        "cannot represent stop the conversion and are listed.",
    )  # fmt: skip
    convert.add_argument("--from-fla", metavar="DIR", required=True, help="the fla model folder")
    convert.add_argument("out", help="new folder for the srope model (load it with AutoModelForCausalLM after import srope.models)")
    convert.add_argument("--position", default="nope", help='nope (default: as fla) | rope | selective_rope | a JSON object {"type": ..., options}')
    convert.add_argument("--seed", type=int, default=0, help="seed of a new encoding's parameters (default: 0)")
    convert.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    from srope.models.convert_fla import convert_fla

    position = json.loads(args.position) if args.position.lstrip().startswith("{") else args.position
    out = convert_fla(args.from_fla, args.out, position=position, seed=args.seed)
    print(f"wrote {out} (load: import srope.models; AutoModelForCausalLM.from_pretrained(...))")
    return 0
