"""python -m mlxr.testing write --config NAME --out DIR [--gguf-type f32|f16|q8_0]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mlxr.testing.fixtures import CONFIGS, GGUF_TYPES, write_fixture


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlxr.testing", description="Write fixture models.")
    sub = parser.add_subparsers(dest="command", required=True)
    write = sub.add_parser("write", help="write an HF directory and a GGUF file with the same random weights")
    write.add_argument("--config", required=True, choices=sorted(CONFIGS))
    write.add_argument("--out", required=True, type=Path)
    write.add_argument("--gguf-type", choices=sorted(GGUF_TYPES), default=None,
                       help="tensor type of the GGUF's matrices (default: the config's)")
    sub.add_parser("list", help="list the fixture configs")
    args = parser.parse_args(argv)
    if args.command == "list":
        for name, spec in CONFIGS.items():
            print(f"{name}\t{spec.family}\tgguf={spec.gguf_type}\tsafetensors={spec.safetensors_dtype}")
        return 0
    paths = write_fixture(args.config, args.out, args.gguf_type)
    print(f"hf_dir: {paths.hf_dir}\ngguf: {paths.gguf_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
