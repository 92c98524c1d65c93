"""The ``holedger`` command line: a thin click group; each room registers its commands."""

from __future__ import annotations

import os
import signal
import sys


def _interrupted_while_starting(*_: object) -> None:
    """Ctrl-C before any command runs (while the modules load): the same one line and
    status as an interrupted command, not a traceback of whichever import it hit."""
    sys.stderr.write("holedger: interrupted\n")
    sys.stderr.flush()
    os._exit(130)


# Only while this module loads (it imports every room): restored below.
_STARTING = signal.getsignal(signal.SIGINT) is signal.default_int_handler
if _STARTING:
    signal.signal(signal.SIGINT, _interrupted_while_starting)

from collections.abc import Callable  # noqa: E402
from importlib import import_module  # noqa: E402
from typing import Any  # noqa: E402

import click  # noqa: E402

from holedger import __version__  # noqa: E402
from holedger.errors import HoledgerError  # noqa: E402
from holedger.output import emit_json, json_written, pipe_closed  # noqa: E402

# Each room's ``commands`` module has ``register(cli)``; the order is the help order.
ROOM_COMMANDS = (
    "holedger.ledger.commands",
    "holedger.tasks.commands",
    "holedger.server.commands",
    "holedger.replay.commands",
    "holedger.bundles.commands",
    "holedger.gateway.commands",
    "holedger.sandboxes.commands",
    "holedger.analysis.commands",
    "holedger.audit.commands",
    "holedger.demo.commands",
)


# The exit status of an interrupted command (Ctrl-C), as shells give a command that
# SIGINT ended: 128 + 2. 1 stays "verification failed".
EXIT_INTERRUPTED = 130

# The options of `holedger` itself, which go before the command.
GLOBAL_OPTIONS = ("--home", "--ledger")


class HoledgerGroup(click.Group):
    """Turns every HoledgerError, and click's own usage errors, into one line on stderr
    with its exit code; a HoledgerError of a command given ``--json`` is also written to
    stdout as ``{"error": {"message", "hint", "type", "exit_code"}}``, so a script reading
    the JSON gets one document either way."""

    wants_json = False

    def main(self, *args: Any, **kwargs: Any) -> Any:
        kwargs["standalone_mode"] = False
        argv = kwargs.get("args", args[0] if args else None)
        words = list(sys.argv[1:] if argv is None else argv)
        json_written(reset=True)
        self.wants_json = (
            "--json" in words[: words.index("--")] if "--" in words else ("--json" in words)
        )
        try:
            status = super().main(*args, **kwargs)
        except click.exceptions.NoArgsIsHelpError as exc:  # `holedger run`: its help
            click.echo(exc.ctx.get_help() if exc.ctx else exc.format_message(), err=True)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            where = exc.ctx.command_path if exc.ctx else "holedger"
            hint = f"see '{where} --help'"
            if isinstance(exc, click.NoSuchOption) and exc.option_name in GLOBAL_OPTIONS:
                # `holedger replay RUN --home DIR`: a global option after the command
                exc = click.NoSuchOption(exc.option_name, ctx=exc.ctx)
                hint = (
                    f"{exc.option_name} is an option of holedger itself: put it before the "
                    f"command, e.g. 'holedger {exc.option_name} ... {where.partition(' ')[2]}'"
                )
            message = " ".join(exc.format_message().split())  # one line, no tabs
            click.echo(f"holedger: error: {message} (hint: {hint})", err=True)
            if self.wants_json and not json_written():
                error = {"message": message, "hint": hint, "type": "usage"}
                emit_json({"error": {**error, "exit_code": exc.exit_code}})
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            click.echo(f"holedger: error: {exc.format_message()}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort as exc:
            if isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt):
                click.echo("holedger: interrupted", err=True)
                sys.exit(EXIT_INTERRUPTED)
            click.echo("holedger: aborted", err=True)
            sys.exit(1)
        except KeyboardInterrupt:  # outside click's own handling of it
            click.echo("holedger: interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        sys.exit(status if isinstance(status, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a closed pipe shows here, not at exit
            return result
        except HoledgerError as exc:
            self._fail(exc)
        except BrokenPipeError:
            pipe_closed()
        except (click.exceptions.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as exc:
            # A storage or file system error nothing turned into a HoledgerError (or a
            # bug): one line naming the file or ledger, never a traceback.
            from holedger.cli_errors import one_line_error, show_traceback

            if show_traceback():
                raise
            self._fail(one_line_error(exc, ctx.obj))

    def _fail(self, exc: HoledgerError) -> None:
        click.echo(f"holedger: error: {exc.one_line()}", err=True)
        if self.wants_json and not json_written():
            emit_json({"error": error_json(exc)})
        sys.exit(exc.exit_code)


def error_json(exc: HoledgerError) -> dict[str, Any]:
    """An error as ``--json`` prints it: message, hint, kind (``usage``, ``not_found``,
    ``verification``, ``bundle``, ...: the error class, snake case, without "Error") and the
    exit status."""
    name = type(exc).__name__.removesuffix("Error") or "holedger"
    kind = "".join(f"_{c.lower()}" if c.isupper() else c for c in name).lstrip("_")
    return {"message": exc.message, "hint": exc.hint, "type": kind, "exit_code": exc.exit_code}


@click.group(cls=HoledgerGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="holedger")
@click.option(
    "--home",
    envvar="HOLEDGER_HOME",
    default=".holedger",
    show_default=True,
    show_envvar=True,
    type=click.Path(file_okay=False),
    help="holedger home: keys, the default SQLite ledger, run repositories, reports.",
)
@click.option(
    "--ledger",
    "ledger_url",
    envvar="HOLEDGER_LEDGER",
    show_envvar=True,
    default=None,
    help="Ledger database URL (default: SQLite inside the home; postgresql+psycopg://...).",
)
@click.pass_context
def cli(ctx: click.Context, home: str, ledger_url: str | None) -> None:
    """holedger: a signed, replayable audit ledger for harness-optimization runs."""
    from holedger.config import Settings

    ctx.obj = Settings.resolve(home, ledger_url)


def _register_rooms(group: click.Group) -> None:
    for module_name in ROOM_COMMANDS:
        module = import_module(module_name)
        register: Callable[[click.Group], None] = module.register
        register(group)


_register_rooms(cli)
if _STARTING and signal.getsignal(signal.SIGINT) is _interrupted_while_starting:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    cli(prog_name="holedger")


if __name__ == "__main__":
    main()
