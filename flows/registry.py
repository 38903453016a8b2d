"""The registry from a shell: ``image-classifier registry`` (``python -m flows.registry`` is the same command). Every
command takes ``--registry`` (a folder or s3://bucket/prefix; default ``registry``); changes update the model's card
in the Prefect UI when a Prefect API is configured (flows/model_card.py).

    image-classifier registry list                                 # the models
    image-classifier registry list digits-resnet18                 # its versions, aliases, tags, figures
    image-classifier registry show digits-resnet18@production      # one version, as JSON
    image-classifier registry alias set digits-resnet18 production 3
    image-classifier registry alias unset digits-resnet18 staging
    image-classifier registry tag digits-resnet18/3 team=vision reviewed=yes
    image-classifier registry untag digits-resnet18/3 reviewed
    image-classifier registry archive digits-resnet18/1            # (unarchive to bring it back)
    image-classifier registry delete digits-resnet18/1
    image-classifier registry search --tag team=vision --where "accuracy>=0.9" --where "log_loss<0.3"
    image-classifier registry fetch digits-resnet18@production models/digits   # a new folder, files checked
    image-classifier registry --json list digits-resnet18            # any command's output as JSON, for scripts

A refused request (unknown model, version or figure, aliased version, malformed condition) prints the reason in one
line and exits 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from tasks.contracts.registry_layout import parse_reference
from tasks.errors import InvalidModelNameError, PipelineInputError
from tasks.registry.core import set_alias, unset_alias
from tasks.registry.fetch import fetch_to
from tasks.registry.manage import (
    VersionView,
    archive,
    delete_version,
    list_models,
    model_versions,
    parse_condition,
    parse_tags,
    search,
    show_version,
    tag,
    untag,
)


def _row(view: VersionView) -> str:
    r = view.registration
    figures = ", ".join(
        f"{k} {v:.4g}"
        for k, v in r.metrics.items()
        if k in ("accuracy", "f1_macro", "log_loss") and isinstance(v, float)
    )
    notes = [f"@{a}" for a in view.aliases] + [f"{k}={v}" for k, v in sorted(view.tags.items())]
    return (
        f"{view.reference}\t{r.created_at:%Y-%m-%d %H:%M}\t{figures}\t{' '.join(notes)}{'  (archived)' * view.archived}"
    )


def _version_reference(text: str) -> tuple[str, int]:
    ref = parse_reference(text)
    if ref.version is None:
        raise InvalidModelNameError(f"{text!r} names no version number: use name/<version>, e.g. digits-resnet18/2")
    return ref.name, ref.version


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--registry", default="registry", help="folder or s3://bucket/prefix (default: registry)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON (for scripts)")
    parser.add_argument("--debug", action="store_true", help="show the traceback of a refused request")
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="the models, or one model's versions")
    listing.add_argument("name", nargs="?")
    commands.add_parser("show", help="one version as JSON").add_argument("reference")
    alias = commands.add_parser("alias", help="set (create or move) or unset an alias")
    alias_commands = alias.add_subparsers(dest="alias_command", required=True)
    setting = alias_commands.add_parser("set")
    setting.add_argument("name")
    setting.add_argument("alias")
    setting.add_argument("version", type=int)
    unsetting = alias_commands.add_parser("unset")
    unsetting.add_argument("name")
    unsetting.add_argument("alias")
    tagging = commands.add_parser("tag", help="add or overwrite tags: key=value ...")
    tagging.add_argument("reference")
    tagging.add_argument("tags", nargs="+")
    untagging = commands.add_parser("untag", help="remove tags by key")
    untagging.add_argument("reference")
    untagging.add_argument("keys", nargs="+")
    commands.add_parser("archive", help="hide a version from 'latest'").add_argument("reference")
    commands.add_parser("unarchive", help="undo archive").add_argument("reference")
    commands.add_parser("delete", help="delete a version no alias points at").add_argument("reference")
    fetching = commands.add_parser("fetch", help="copy a version to a new folder, its files checked")
    fetching.add_argument("reference", help="name, name/3 or name@production")
    fetching.add_argument("folder", help="a new (or empty) folder")
    searching = commands.add_parser("search", help="versions by tag and figure")
    searching.add_argument("--name", action="append", help="only this model (repeatable)")
    searching.add_argument("--tag", action="append", default=[], help="key=value (repeatable)")
    searching.add_argument("--where", action="append", default=[], help="e.g. 'accuracy>=0.9' (repeatable)")
    searching.add_argument("--archived", action="store_true", help="include archived versions")
    return parser


def _view_json(view: VersionView) -> dict:
    return {
        **view.registration.model_dump(mode="json"),
        "tags": view.tags,
        "archived": view.archived,
        "aliases": view.aliases,
    }


def _run(args: argparse.Namespace) -> tuple[str | list | dict, str | None]:
    """Carry out the command: what to print (text, or what ``--json`` prints) and the model it changed (whose card
    to update), if any."""
    registry, text = args.registry, not args.json
    if args.command == "list":
        if args.name:
            views = model_versions(registry, args.name)
            return ("\n".join(_row(v) for v in views) if text else [_view_json(v) for v in views]), None
        models = list_models(registry)
        if text and not models:  # on stderr: a script reading the (empty) list is not disturbed
            print(
                f"no models in {registry}: none registered there yet (`make run` or `image-classifier train` "
                "registers one; --registry names another registry)",
                file=sys.stderr,
            )
        return ("\n".join(models) if text else models), None
    if args.command == "show":
        shown = _view_json(show_version(registry, args.reference))
        return (json.dumps(shown, indent=2) if text else shown), None
    if args.command == "fetch":
        registration = fetch_to(registry, args.reference, args.folder)
        folder = os.path.abspath(args.folder)
        done = {"name": registration.name, "version": registration.version, "folder": folder}
        return (f"{registration.name}/{registration.version} -> {folder} (files checked)" if text else done), None
    if args.command == "alias":
        if args.alias_command == "set":
            record = set_alias(registry, args.name, args.alias, args.version)
            moved = f" (was version {record.previous_version})" if record.previous_version else ""
            line = f"{args.name}@{args.alias} -> version {record.version}{moved}"
        else:
            record = unset_alias(registry, args.name, args.alias)
            line = f"{args.name}@{args.alias} unset (was version {record.previous_version})"
        return (line if text else record.model_dump(mode="json")), args.name
    if args.command in ("tag", "untag", "archive", "unarchive"):
        if args.command == "tag":
            view = tag(registry, args.reference, parse_tags(args.tags))
        elif args.command == "untag":
            view = untag(registry, args.reference, args.keys)
        else:
            view = archive(registry, args.reference, archived=args.command == "archive")
        return (_row(view) if text else _view_json(view)), view.registration.name
    if args.command == "delete":
        name, version = _version_reference(args.reference)
        delete_version(registry, name, version)
        return (f"deleted {name}/{version}" if text else {"deleted": f"{name}/{version}"}), name
    found = search(
        registry,
        tags=parse_tags(args.tag),
        where=[parse_condition(w) for w in args.where],
        names=args.name,
        include_archived=args.archived,
    )
    return ("\n".join(_row(v) for v in found) if text else [_view_json(v) for v in found]), None


def _print(output: str | list | dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(output, indent=2))
    elif output:
        print(output)


def main(argv: list[str] | None = None, prog: str = "python -m flows.registry") -> int:
    args = _parser(prog).parse_args(argv)
    try:
        output, changed = _run(args)
        _print(output, args.json)
        if changed:
            from flows.model_card import update_model_card_if_connected

            note = update_model_card_if_connected(args.registry, changed)
            print(note, file=sys.stderr if args.json else sys.stdout)
        sys.stdout.flush()
    except PipelineInputError as error:
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (`... | head`): stop quietly, as other commands do. Point stdout at devnull so
        # that Python's flush at exit does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
