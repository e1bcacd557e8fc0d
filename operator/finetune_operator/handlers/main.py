"""`ftjob operator`: set up logging, build the config from flags, and hand over to kopf.

Log format is set here, before kopf starts (a startup handler runs too late for it).
"""

import argparse
import logging
import os
import socket
import uuid
from pathlib import Path
from urllib.parse import urlparse

import kopf

from finetune_api import constants
from finetune_operator.handlers.state import OperatorConfig
from finetune_operator.policy import policy_from_flags
from finetune_operator.progress.tls import ensure_pair

LOG_FORMAT = "[%(asctime)s] %(name)s [%(levelname)-8s] %(message)s"
"""kopf's FULL format with the logger's whole name: kopf's own (`%(name)-20.20s`) cut names to 20 characters, so
`finetune_operator.progress.server` and `finetune_operator.progress.tls` both read `finetune_operator.pr`."""


def build_config(args: argparse.Namespace) -> OperatorConfig:
    """Flags → the config the handlers read from memo."""
    url_host = urlparse(args.progress_url).hostname if args.progress_url else None
    hosts = tuple(dict.fromkeys([*(args.progress_host or ()), *([url_host] if url_host else []), "localhost"]))
    cert, key, self_signed = ensure_pair(args.progress_cert, args.progress_key, list(hosts))
    ca_file = args.progress_ca or (cert if self_signed else None)
    image = getattr(args, "image", None) or constants.DEFAULT_TRAINER_IMAGE
    return OperatorConfig(
        image=image,
        policy=policy_from_flags(args, image=image),
        progress_url=args.progress_url,
        progress_port=args.progress_port,
        progress_cert=cert,
        progress_key=key,
        progress_hosts=hosts,
        progress_ca=Path(ca_file).read_text() if ca_file else None,
        metrics_port=args.metrics_port,
        max_concurrent_reconciles=args.max_concurrent_reconciles,
        peering_name=None if args.standalone else args.peering,
        priority=args.priority,
        identity=f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}",
        clusterwide=args.all_namespaces or not args.namespace,
    )


def run_operator(args: argparse.Namespace) -> int:
    """Run kopf with our handlers until SIGINT/SIGTERM; 0 on a clean stop."""
    # kopf's DEBUG lines dump whole bodies (spec, env), so kopf stays at INFO even with --verbose.
    kopf.configure(verbose=False, log_format=LOG_FORMAT)  # type: ignore[arg-type]  # kopf takes a format string too
    logging.getLogger("kopf").setLevel(logging.INFO if args.verbose else logging.WARNING)
    logging.getLogger("finetune_operator").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    # The client's debug lines carry response bodies, TokenReview ones included (with the token).
    logging.getLogger("kubernetes_asyncio").setLevel(logging.WARNING)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    import finetune_operator.handlers  # noqa: F401  (registers the handlers)

    namespaces = list(args.namespace)
    config = build_config(args)
    kopf.run(
        standalone=config.peering_name is None,
        peering_name=config.peering_name,
        priority=config.priority,
        identity=config.identity,  # type: ignore[arg-type]
        liveness_endpoint=args.liveness or None,
        clusterwide=config.clusterwide,
        namespaces=namespaces,
        memo=kopf.Memo(config=config),
    )
    return 0
