"""The `autoflash` command: a click group, one module a command (each only parses and calls the library)."""

import click

from autoflash.cli.bench import bench
from autoflash.cli.export import export
from autoflash.cli.merge import merge
from autoflash.cli.show import show
from autoflash.cli.tune import tune


@click.group()
@click.version_option(package_name="autoflash")
def main():
    """Generate, tune and dispatch FlashAttention kernels written in Triton."""


for command in (tune, show, bench, export, merge):
    main.add_command(command)
