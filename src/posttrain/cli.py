"""posttrain command line. Thin: parses arguments, imports the heavy module a command needs only when it runs.

    posttrain validate RECIPE [--set a.b=c ...] [--schema]
    posttrain run RECIPE [--set ...]                 whole pipeline locally (kfp.local)
    posttrain compile RECIPE -o pipelines/kfp/posttrain.yaml
    posttrain stage NAME RECIPE --out DIR [--input k=path ...]
    posttrain rl RECIPE [--set ...] [--out DIR]      the async RL job standalone (torchrun)
    posttrain models | promote | rollback            MLflow registry stages (aliases)
    posttrain push NAME@ALIAS DEST                   push a registered model to a bucket / repo / path
"""

from __future__ import annotations

import argparse
import json
import sys

EXIT_BAD_INPUT = 2


def _add_recipe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe", help="recipe YAML, e.g. pipelines/recipes/tiny-cpu.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a recipe field, e.g. --set rl.max_steps=10 (repeatable)")


def _load(args):
    from posttrain.data.preflight import preflight
    from posttrain.recipe import load_recipe

    recipe = load_recipe(args.recipe, args.overrides)
    preflight(recipe, args.recipe)
    return recipe


def cmd_validate(args) -> int:
    from posttrain.data.preflight import preflight
    from posttrain.recipe import RecipeError, load_recipe, schema_markdown

    if args.schema:
        print(schema_markdown())
        return 0
    if not args.recipe:
        print("posttrain validate: give a RECIPE path (or --schema)", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        recipe = load_recipe(args.recipe, args.overrides)
        preflight(recipe, args.recipe)
    except RecipeError as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    print(f"{args.recipe}: ok (name={recipe.name}, algorithm={recipe.algorithm}, hash={recipe.hash()})")
    return 0


def cmd_run(args) -> int:
    from posttrain.orchestrate.local import run_pipeline

    summary = run_pipeline(_load(args), recipe_path=args.recipe, fresh=args.fresh)
    return 0 if summary.ok else 1


def cmd_compile(args) -> int:
    from posttrain.orchestrate.kfp_pipeline import compile_components, compile_pipeline

    path = compile_pipeline(_load(args), args.output)
    print(f"wrote {path}")
    if args.components:
        for p in compile_components(args.components):
            print(f"wrote {p}")
    return 0


def cmd_stage(args) -> int:
    from posttrain.orchestrate.local import run_one_stage

    inputs = dict(kv.split("=", 1) for kv in args.input)
    result = run_one_stage(args.name, _load(args), inputs, args.out)
    print(json.dumps(result.to_dict(), indent=2, default=str))
    return 0


def cmd_rl(args) -> int:
    from posttrain.rl.launch import run_standalone

    result = run_standalone(_load(args), out_dir=args.out, model_path=args.model)
    print(json.dumps(result.to_dict(), indent=2, default=str))
    return 0


def cmd_models(args) -> int:
    from posttrain.registry import print_models

    print_models(args.tracking_uri, name=args.name)
    return 0


def cmd_promote(args) -> int:
    from posttrain.registry import promote

    promote(args.name, version=args.version, to=args.to, reason=args.reason, tracking_uri=args.tracking_uri)
    return 0


def cmd_rollback(args) -> int:
    from posttrain.registry import rollback

    rollback(args.name, stage=args.stage, reason=args.reason, tracking_uri=args.tracking_uri)
    return 0


def cmd_push(args) -> int:
    from posttrain.hub import push_registered

    push_registered(args.ref, args.dest, tracking_uri=args.tracking_uri)
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="posttrain", description="LLM post-training pipeline: SFT, reward model, async RL or DPO, evaluate, register, promote, push.")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="check a recipe and report every problem at once")
    p.add_argument("recipe", nargs="?")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--schema", action="store_true", help="print every recipe field with type, default and doc")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("run", help="run the whole pipeline locally through the KFP local runner")
    _add_recipe_args(p)
    p.add_argument("--fresh", action="store_true", help="ignore finished stage outputs and rerun every stage")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("compile", help="compile the KFP pipeline to IR YAML for a cluster")
    _add_recipe_args(p)
    p.add_argument("-o", "--output", default="pipelines/kfp/posttrain.yaml")
    p.add_argument("--components", default=None, metavar="DIR", help="also write each component spec to DIR/<step>/component.yaml")
    p.set_defaults(func=cmd_compile)

    p = sub.add_parser("stage", help="run one stage (what a KFP component or Airflow task calls)")
    p.add_argument("name", help="base | sft | reward | dpo | rl | evaluate | register | gate | push")
    _add_recipe_args(p)
    p.add_argument("--input", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_stage)

    p = sub.add_parser("rl", help="run the async RL job standalone")
    _add_recipe_args(p)
    p.add_argument("--model", default=None, help="policy to start from (default: the pipeline's SFT model if present, else the recipe model)")
    p.add_argument("--out", default=None, help="output directory (default: <output_dir>/<name>/rl-standalone; never the pipeline's rl step)")
    p.set_defaults(func=cmd_rl)

    for name, fn, hlp in (("models", cmd_models, "list registered models, versions, aliases and metrics"),
                          ("promote", cmd_promote, "move a stage alias to a version, with a recorded reason"),
                          ("rollback", cmd_rollback, "move a stage alias back to its previous holder")):
        p = sub.add_parser(name, help=hlp)
        p.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db)")
        if name == "models":
            p.add_argument("name", nargs="?", default=None)
        else:
            p.add_argument("name")
            p.add_argument("--reason", required=(name == "promote"), default="rollback")
        if name == "promote":
            p.add_argument("--version", required=True, type=int)
            p.add_argument("--to", required=True, choices=["staging", "production"])
        if name == "rollback":
            p.add_argument("--stage", required=True, choices=["staging", "production"])
        p.set_defaults(func=fn)

    p = sub.add_parser("push", help="push a registered model (NAME@ALIAS or NAME/VERSION) to DEST")
    p.add_argument("ref")
    p.add_argument("dest", help="local path, hf://buckets/<ns>/<bucket>/<prefix>, hf://<ns>/<repo>, s3://bucket/prefix")
    p.add_argument("--tracking-uri", default=None)
    p.set_defaults(func=cmd_push)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from posttrain.errors import PosttrainError
    from posttrain.recipe import RecipeError

    try:
        return args.func(args)
    except RecipeError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except PosttrainError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except BrokenPipeError:  # `posttrain ... | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("interrupted; finished stage outputs are kept and a rerun resumes from them", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
