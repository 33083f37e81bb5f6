"""``python -m asyncrl.operator.main``: run the operator (what the chart's Deployment starts)."""

import argparse
import logging
from collections.abc import Sequence

import kopf

from asyncrl.operator.config import OperatorSettings
from asyncrl.operator.handlers import build_registry


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="asyncrl-operator", description=__doc__)
    parser.add_argument("--namespace", "-n", action="append", default=[],
                        help="watch this namespace (repeat); default: all namespaces")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="liveness endpoint URL")
    parser.add_argument("--log-level", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    cfg = OperatorSettings.from_env()
    kopf.run(
        registry=build_registry(cfg),
        standalone=True,  # one replica with strategy Recreate: no peering needed
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
    )


if __name__ == "__main__":
    main()
