"""Command-line flags shared by `ftjob status`, `watch` and `logs`: which cluster, which namespace, which job.

Kept apart from `client` so that building the parser (every `ftjob` command does) loads no Kubernetes client.
The flags mean what kubectl's do: `--kubeconfig` wins over `KUBECONFIG`, which wins over `~/.kube/config`;
without any kubeconfig, a process in a pod uses its ServiceAccount; `-n` wins over the context's namespace.
"""

import argparse


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    """`JOB`, `-n/--namespace`, `--kubeconfig`, `--context`."""
    parser.add_argument("job", help="name of the FineTuneJob")
    parser.add_argument("-n", "--namespace", default=None,
                        help="namespace of the job (default: the context's, else 'default')")
    parser.add_argument("--kubeconfig", default=None,
                        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else in-cluster)")
    parser.add_argument("--context", default=None, help="kubeconfig context (default: its current-context)")
