"""``attnviz env``: what a bug report needs (versions, device, the fused kernel and why, the caches)."""

from __future__ import annotations

import json
from typing import Annotated

import typer


def env(
    as_json: Annotated[
        bool, typer.Option("--json", help="Print JSON instead of text. Example: attnviz env --json > env.json")
    ] = False,
) -> None:
    """Print the versions of attnviz, torch, transformers and Python, the device, the fused kernel's state
    and why, and where the caches live: paste it into a bug report.

    Examples:

      attnviz env

      attnviz env --json > env.json
    """
    from attnviz.models.environment import describe_environment

    environment = describe_environment()
    if as_json:
        print(json.dumps(environment.to_dict(), indent=2))
        return
    print(f"python: {environment.python} ({environment.platform})")
    for name, version in environment.versions.items():
        print(f"{name}: {version}")
    device = environment.device
    gpus = ", ".join(device["gpus"]) or "none"
    print(
        f"device: cpu {device['cpu_capability']}, {device['physical_cores']} physical cores, "
        f"{device['torch_threads']} torch threads; cuda {device['cuda']}; gpus: {gpus}"
    )
    kernel = environment.kernel
    print(f"fused kernel: {kernel['state']}" + (f" ({kernel['why']})" if kernel["why"] else ""))
    if kernel["build_directory"]:
        print(f"kernel build directory: {kernel['build_directory']}")
    for device_kind, used in environment.kernels.items():
        print(f"statistics on {device_kind}: {used}")
    for what, path in environment.caches.items():
        print(f"cache, {what}: {path}")
    for name, value in environment.variables.items():
        print(f"environment: {name}={value}")


def register(app: typer.Typer) -> None:
    app.command("env")(env)
