"""``kubectl agentrun completion bash|zsh|fish``: a static completion script made from the
argument parser itself (its commands, their options and the values an option or argument
accepts), so that it never falls behind the commands. Pure: a parser in, text out.

The scripts complete the ``kubectl-agentrun`` command; a RUN argument is completed with the
names of the AgentRuns ``kubectl get agentruns`` lists (honouring a ``-n`` already typed).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

SHELLS = ("bash", "zsh", "fish")
PROGRAM = "kubectl-agentrun"
_FUNC = "_kubectl_agentrun"


@dataclass
class Verb:
    """One command as the completion sees it."""

    name: str
    help: str
    options: list[str] = field(default_factory=list)
    """Every option string (``-o``, ``--output``)."""
    flags: set[str] = field(default_factory=set)
    """The options that take no value."""
    choices: dict[str, list[str]] = field(default_factory=dict)
    """The values of options that accept only some."""
    positionals: list[str] = field(default_factory=list)
    """The metavars of its arguments, in order (RUN, STEP, SHELL)."""
    positional_choices: dict[int, list[str]] = field(default_factory=dict)


def _subparsers(
    parser: argparse.ArgumentParser,
) -> argparse._SubParsersAction[argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    raise ValueError("the parser has no commands")


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0


def verbs(parser: argparse.ArgumentParser) -> list[Verb]:
    """The commands of ``parser`` with their options and arguments, in the parser's order."""
    sub = _subparsers(parser)
    helps = {a.dest: a.help or "" for a in sub._choices_actions}
    found = []
    for name, p in sub.choices.items():
        verb = Verb(name, helps.get(name, ""))
        index = 0
        for action in p._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                if isinstance(action, argparse._HelpAction):
                    verb.options += action.option_strings
                    verb.flags |= set(action.option_strings)
                continue
            if action.option_strings:
                verb.options += action.option_strings
                if not _takes_value(action):
                    verb.flags |= set(action.option_strings)
                elif action.choices:
                    for opt in action.option_strings:
                        verb.choices[opt] = [str(c) for c in action.choices]
            else:
                verb.positionals.append(str(action.metavar or action.dest).upper())
                if action.choices:
                    verb.positional_choices[index] = [str(c) for c in action.choices]
                index += 1
        found.append(verb)
    return found


def top_options(parser: argparse.ArgumentParser) -> list[str]:
    return [o for a in parser._actions for o in a.option_strings]


def script(parser: argparse.ArgumentParser, shell: str) -> str:
    """The completion script for ``shell``."""
    if shell == "bash":
        return _bash(parser)
    if shell == "zsh":
        return _zsh(parser)
    if shell == "fish":
        return _fish(parser)
    raise ValueError(f"no completion for {shell}; choose one of {', '.join(SHELLS)}")


_VALUE_OPTIONS_TOP = ("-n", "--namespace", "--context", "--kubeconfig")


def _bash(parser: argparse.ArgumentParser) -> str:
    vs = verbs(parser)
    names = " ".join(v.name for v in vs)
    cases = []
    for v in vs:
        takes = " ".join(o for o in v.options if o not in v.flags)
        choice_cases = "".join(
            f"            {opt}) COMPREPLY=($(compgen -W '{' '.join(vals)}' -- \"$cur\"));"
            " return;;\n"
            for opt, vals in v.choices.items()
        )
        positional = ""
        if v.positional_choices:
            vals = " ".join(next(iter(v.positional_choices.values())))
            positional = f"            COMPREPLY=($(compgen -W '{vals}' -- \"$cur\")); return\n"
        elif v.positionals and v.positionals[0] == "RUN":
            positional = (
                "            if [[ $npos -eq 0 ]]; then COMPREPLY=($(compgen -W "
                '"$(_kubectl_agentrun_runs)" -- "$cur")); fi; return\n'
            )
        cases.append(
            f"        {v.name})\n"
            f"            case $prev in\n{choice_cases}"
            f"            {'|'.join(takes.split()) or '__none__'}) return;;\n"
            "            esac\n"
            f"            if [[ $cur == -* ]]; then COMPREPLY=($(compgen -W "
            f"'{' '.join(v.options)}' -- \"$cur\")); return; fi\n"
            f"{positional}"
            "            ;;\n"
        )
    top = " ".join(top_options(parser))
    value_options = sorted(
        {o for v in vs for o in v.options if o not in v.flags} | set(_VALUE_OPTIONS_TOP)
    )
    return f"""# bash completion for {PROGRAM} (kubectl agentrun); generated by
#   kubectl agentrun completion bash
# Load it with: source <(kubectl agentrun completion bash)
_kubectl_agentrun_runs() {{
    local ns=() i
    for ((i = 1; i < ${{#COMP_WORDS[@]}} - 1; i++)); do
        case ${{COMP_WORDS[i]}} in
            -n|--namespace) ns=(-n "${{COMP_WORDS[i+1]}}");;
            --namespace=*) ns=(-n "${{COMP_WORDS[i]#--namespace=}}");;
        esac
    done
    kubectl get agentruns "${{ns[@]}}" -o name 2>/dev/null | sed 's|.*/||'
}}

{_FUNC}() {{
    local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
    local cmd="" npos=0 i w skip=0
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${{COMP_WORDS[i]}}
        if [[ $skip -eq 1 ]]; then skip=0; continue; fi
        case $w in
            {"|".join(value_options)}) skip=1;;
            -*) ;;
            *) if [[ -z $cmd ]]; then cmd=$w; else npos=$((npos + 1)); fi;;
        esac
    done
    COMPREPLY=()
    if [[ -z $cmd ]]; then
        case $prev in
            {"|".join(_VALUE_OPTIONS_TOP)}) return;;
        esac
        if [[ $cur == -* ]]; then
            COMPREPLY=($(compgen -W '{top}' -- "$cur"))
        else
            COMPREPLY=($(compgen -W '{names}' -- "$cur"))
        fi
        return
    fi
    case $cmd in
{"".join(cases)}    esac
}}
complete -F {_FUNC} {PROGRAM}
"""


def _zsh_text(text: str) -> str:
    return text.replace("'", "'\\''").replace(":", "\\:").replace("[", "\\[").replace("]", "\\]")


def _zsh(parser: argparse.ArgumentParser) -> str:
    vs = verbs(parser)
    commands = "\n".join(f"        '{v.name}:{_zsh_text(v.help)}'" for v in vs)
    cases = []
    for v in vs:
        specs = []
        for opt in v.options:
            if opt in v.flags:
                specs.append(f"'{opt}[]'")
            elif opt in v.choices:
                specs.append(f"'{opt}[]:value:({' '.join(v.choices[opt])})'")
            else:
                specs.append(f"'{opt}[]:value:'")
        for i, metavar in enumerate(v.positionals):
            if i in v.positional_choices:
                action = f"({' '.join(v.positional_choices[i])})"
            elif metavar == "RUN":
                action = "_kubectl_agentrun_runs"
            else:
                action = " "
            specs.append(f"'{i + 1}:{metavar.lower()}:{action}'")
        cases.append(f"        {v.name}) _arguments {' '.join(specs)};;")
    top = " ".join(f"'{o}[]:value:'" for o in _VALUE_OPTIONS_TOP)
    return f"""#compdef {PROGRAM}
# zsh completion for {PROGRAM} (kubectl agentrun); generated by
#   kubectl agentrun completion zsh
# Load it with: source <(kubectl agentrun completion zsh)   (after compinit)
_kubectl_agentrun_runs() {{
    local -a runs ns
    local i
    for ((i = 2; i < CURRENT; i++)); do
        [[ $words[i] == (-n|--namespace) ]] && ns=(-n $words[i+1])
    done
    runs=(${{(f)"$(kubectl get agentruns $ns -o name 2>/dev/null | sed 's|.*/||')"}})
    compadd -a runs
}}

{_FUNC}() {{
    local -a commands
    commands=(
{commands}
    )
    local curcontext=$curcontext state line
    _arguments -C '-h[help]' '--help[help]' '--version[version]' {top} \\
        '1:command:->command' '*::arg:->args'
    case $state in
        command) _describe -t commands command commands;;
        args)
            case $words[1] in
{chr(10).join(cases)}
            esac;;
    esac
}}

compdef {_FUNC} {PROGRAM}
"""


def _fish_text(text: str) -> str:
    return text.replace("\\", "\\\\").replace("'", "\\'")


def _fish(parser: argparse.ArgumentParser) -> str:
    vs = verbs(parser)
    lines = [
        f"# fish completion for {PROGRAM} (kubectl agentrun); generated by",
        "#   kubectl agentrun completion fish",
        "# Load it with: kubectl agentrun completion fish | source",
        "function __kubectl_agentrun_runs",
        "    set -l ns (string match -r -- '(?:-n|--namespace)[ =](\\S+)' (commandline -c))",
        "    if test (count $ns) -ge 2",
        "        kubectl get agentruns -n $ns[2] -o name 2>/dev/null | string replace -r '.*/' ''",
        "    else",
        "        kubectl get agentruns -o name 2>/dev/null | string replace -r '.*/' ''",
        "    end",
        "end",
        f"complete -c {PROGRAM} -f",
    ]
    for opt in _VALUE_OPTIONS_TOP:
        lines.append(f"complete -c {PROGRAM} -n '__fish_use_subcommand' {_fish_opt(opt)} -r")
    lines.append(f"complete -c {PROGRAM} -n '__fish_use_subcommand' -l version")
    for v in vs:
        lines.append(
            f"complete -c {PROGRAM} -n '__fish_use_subcommand' -a {v.name} "
            f"-d '{_fish_text(v.help)}'"
        )
        when = f"'__fish_seen_subcommand_from {v.name}'"
        for opt in v.options:
            extra = ""
            if opt in v.choices:
                extra = f" -x -a '{' '.join(v.choices[opt])}'"
            elif opt not in v.flags:
                extra = " -r"
            lines.append(f"complete -c {PROGRAM} -n {when} {_fish_opt(opt)}{extra}")
        if v.positional_choices:
            vals = " ".join(next(iter(v.positional_choices.values())))
            lines.append(f"complete -c {PROGRAM} -n {when} -a '{vals}'")
        elif v.positionals and v.positionals[0] == "RUN":
            lines.append(f"complete -c {PROGRAM} -n {when} -a '(__kubectl_agentrun_runs)'")
    return "\n".join(lines) + "\n"


def _fish_opt(opt: str) -> str:
    return f"-l {opt[2:]}" if opt.startswith("--") else f"-s {opt[1:]}"
