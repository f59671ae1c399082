"""`lossguard completion`: a bash or zsh completion script drawn from the parser itself."""

from __future__ import annotations

import argparse
import sys

from .exits import EXIT_OK
from .help_text import Formatter


def add(sub: argparse._SubParsersAction, *, parser: argparse.ArgumentParser) -> None:
    """The command, completing what `parser` (the whole command line, this one in it) knows."""
    p = sub.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        formatter_class=Formatter,
        description="Print a script that completes lossguard's commands and options in your shell.",
        epilog='Example:\n  source <(lossguard completion bash)        # or add it to ~/.bashrc\n'
        '  lossguard completion zsh > "${fpath[1]}/_lossguard"',
    )
    p.add_argument("shell", choices=["bash", "zsh"], help="the shell to complete in")
    p.set_defaults(func=lambda args: _run(args, parser))


def completion_script(parser: argparse.ArgumentParser, shell: str) -> str:
    """Drawn from the parser itself, so it never goes stale: commands at the first word, each
    command's options after it, files and folders otherwise."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = sorted(sub.choices)
    cases = []
    for name in commands:
        options = sorted(o for a in sub.choices[name]._actions for o in a.option_strings)
        cases.append(f'        {name}) opts="{" ".join(options)}" ;;')
    body = "\n".join(cases)
    script = f"""_lossguard() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} opts
    if [ "$COMP_CWORD" -eq 1 ]; then
        COMPREPLY=($(compgen -W "{" ".join(commands)} --help --version --debug" -- "$cur"))
        return
    fi
    case "${{COMP_WORDS[1]}}" in
{body}
        *) opts="" ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
}}
complete -o filenames -F _lossguard lossguard
"""
    if shell == "zsh":
        script = "#compdef lossguard\nautoload -U +X bashcompinit && bashcompinit\n" + script
    return script


def _run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    sys.stdout.write(completion_script(parser, args.shell))
    return EXIT_OK
