"""Where the operator's API connection comes from, and one line saying what was tried when none loads.

The order is the official client's: the in-cluster service account (unless --kubeconfig names a file), then a
kubeconfig: --kubeconfig, else $KUBECONFIG (a `:`-separated list, merged as kubectl does), else ~/.kube/config.
The client itself raises "No configuration found" naming no path, or a multi-line YAML error: a user cannot tell
which file it read, so every failure here becomes a one-line UserError naming each place tried and what was wrong.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import Enum

import kubernetes
import yaml

from zerotrain.errors import UserError

DEFAULT_KUBECONFIG = "~/.kube/config"
_SEPARATOR: str = kubernetes.config.kube_config.ENV_KUBECONFIG_PATH_SEPARATOR
_FIX = "set KUBECONFIG or pass --kubeconfig to a working kubeconfig file, or run in a pod with a service account"
_FIX_EXPLICIT = "pass --kubeconfig the path of a working kubeconfig file"
# What load_incluster_config raised -> what to tell the user; the client's wording names neither variable nor file.
_IN_CLUSTER_WHY = {
    "Service host/port is not set.": "$KUBERNETES_SERVICE_HOST/$KUBERNETES_SERVICE_PORT not set",
    "Service token file does not exist.": f"{kubernetes.config.incluster_config.SERVICE_TOKEN_FILENAME} not found",
    "Service certification file does not exist.": f"{kubernetes.config.incluster_config.SERVICE_CERT_FILENAME} "
    "not found",
}


class ConnectionSource(str, Enum):
    """Where the connection settings came from."""

    IN_CLUSTER = "in-cluster"
    KUBECONFIG = "kubeconfig"
    EXPLICIT = "explicit"


def _in_cluster(config: kubernetes.client.Configuration) -> str | None:
    """Load the pod's service account into `config`: None on success, else why it is not there."""
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException as e:
        return _IN_CLUSTER_WHY.get(str(e), str(e))
    except OSError as e:  # a token or CA file there but unreadable: say so, then try the kubeconfig as before
        return f"{e.filename}: {e.strerror}"
    return None


def _exists(path: str) -> bool:
    return os.path.exists(os.path.expanduser(path))


def _not_found(paths: list[str], origin: str) -> str:
    """`$KUBECONFIG=/a (not found)`: where the kubeconfig was looked for, for the message."""
    if not paths:
        return f"{origin} (set, but names no file)"
    # What `~` stood for is worth saying: HOME is often not what the user thinks (sudo, a container).
    full = [os.path.expanduser(p) for p in paths]
    missing = "not found" if full == paths and len(paths) == 1 else ", ".join(f"{f} not found" for f in full)
    if origin == "default":
        return f"{DEFAULT_KUBECONFIG} ({missing}; $KUBECONFIG is not set)"
    sep = "=" if origin == "$KUBECONFIG" else " "
    return f"{origin}{sep}{_SEPARATOR.join(paths)} ({missing})"


def _one_line(e: BaseException) -> str:
    if isinstance(e, yaml.MarkedYAMLError) and e.problem_mark is not None:
        mark = e.problem_mark
        return f"not valid YAML: {e.problem} at line {mark.line + 1}, column {mark.column + 1}"
    if isinstance(e, (AttributeError, TypeError)):
        # The client indexes the parsed YAML as a mapping: a list or a scalar fails deep inside it.
        return "not a kubeconfig (expected a mapping with clusters, users, contexts and current-context)"
    text = " ".join(str(e).split()) or type(e).__name__
    return text.removeprefix("Invalid kube-config file. ").removeprefix("Invalid kube-config. ")


def load(
    config: kubernetes.client.Configuration, kubeconfig: str | None = None, environ: Mapping[str, str] | None = None
) -> ConnectionSource:
    """Fill `config` from the in-cluster service account or a kubeconfig; UserError (one line) if neither loads."""
    environ = os.environ if environ is None else environ
    tried: list[str] = []
    if kubeconfig is not None:
        origin, paths = "--kubeconfig", kubeconfig
    else:
        why_not = _in_cluster(config)
        if why_not is None:
            return ConnectionSource.IN_CLUSTER
        tried.append(f"the in-cluster service account ({why_not})")
        origin, paths = (
            ("$KUBECONFIG", environ["KUBECONFIG"]) if "KUBECONFIG" in environ else ("default", DEFAULT_KUBECONFIG)
        )
    # The client splits every path it is given at `:`, as kubectl splits $KUBECONFIG.
    listed = [p for p in paths.split(_SEPARATOR) if p]
    fix = _FIX_EXPLICIT if origin == "--kubeconfig" else _FIX
    if not any(_exists(p) for p in listed):
        tried.append(_not_found(listed, origin))
        raise UserError(f"cannot load a kubeconfig: tried {', then '.join(tried)}; {fix}")
    try:
        # Passed explicitly: the client reads $KUBECONFIG once, when it is imported, not when the operator starts.
        kubernetes.config.load_kube_config(config_file=paths, client_configuration=config)
    except (kubernetes.config.ConfigException, yaml.YAMLError, OSError, ValueError, AttributeError, TypeError) as e:
        found = ", ".join(os.path.expanduser(p) for p in listed if _exists(p))
        named = "" if origin == "default" else f" (from {origin})"
        if "current-context" in str(e):
            fix = f"pick a context (kubectl config use-context NAME --kubeconfig {found}), or {fix}"
        raise UserError(f"cannot load the kubeconfig {found}{named}: {_one_line(e)}; {fix}") from e
    return ConnectionSource.KUBECONFIG
