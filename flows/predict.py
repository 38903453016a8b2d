"""``image-classifier predict PHOTO… MODEL``: each photo's label and its most probable classes, with no Prefect
server and nothing written. MODEL is a ModelDirectory or a registry reference (``--registry``, default
``registry``).

    image-classifier predict photo.jpg digits-resnet18@production
    image-classifier predict IMG_0042.HEIC IMG_0043.HEIC runs/<run>/model --top-k 3
    image-classifier predict photo.jpg digits-resnet18 --json        # for scripts
    image-classifier predict photo.jpg runs/<run>/model --precision int8 --calibration runs/<run>/data/validation

A missing or unreadable photo, or an unknown model, is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys

from flows.cli import CommandParser
from tasks.errors import PipelineInputError


def main(argv: list[str] | None = None, prog: str = "python -m flows.predict") -> int:
    parser = CommandParser(
        prog=prog, description=__doc__.replace("``", ""), formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("photos", nargs="+", metavar="PHOTO", help="image files (JPEG, PNG, WebP, HEIC, AVIF, …)")
    parser.add_argument(
        "model", metavar="MODEL", help="a ModelDirectory or a registry reference (name, name/3, name@alias)"
    )
    parser.add_argument("--registry", default="registry", help="where MODEL references resolve (a folder or s3://…)")
    parser.add_argument("--top-k", type=int, default=3, help="how many of the most probable classes to show (3)")
    parser.add_argument("--json", action="store_true", help="one JSON list of {image, label, top} on stdout")
    parser.add_argument(
        "--precision",
        choices=("fp32", "int8"),
        default="fp32",
        help="fp32, or int8: ONNX Runtime's quantized model on the CPU, made once beside the model (fp32)",
    )
    parser.add_argument(
        "--calibration", metavar="DIR", help="int8 the first time: the model's validation ImageDirectory"
    )
    args = parser.parse_args(argv)
    if args.top_k < 1:
        parser.error(f"--top-k {args.top_k}: give 1 or more")
    from tasks.predict.classifier import Classifier

    try:
        classifier = Classifier.load(args.model, args.registry, precision=args.precision, calibration=args.calibration)
        predictions = classifier.predict(args.photos)
    except PipelineInputError as error:
        print(f"{prog}: error: {error}", file=sys.stderr)
        return 2
    if args.json:
        rows = [{"image": p.image, "label": p.label, "top": dict(p.top(args.top_k))} for p in predictions]
        print(json.dumps(rows, indent=2))
    else:
        for p in predictions:
            print(f"{p.image}: {p.label}  ({', '.join(f'{name} {value:.3f}' for name, value in p.top(args.top_k))})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
