"""Shell allowlists are parsed, not prefix-matched: what the shell would run is what is checked."""

from __future__ import annotations

import pytest

from corral.policy.shell import (
    MAX_SOURCE_BYTES,
    Pattern,
    SimpleCommand,
    check_scope,
    parse,
    parse_pattern,
)

SCOPE = ("ls *", "kubectl *")
BYPASS_SCOPE = ("ls *", "kubectl *", "find *")


def argvs(source: str) -> list[tuple[str, ...]]:
    return [c.argv for c in parse(source).commands]


# --------------------------------------------------------------------------------------------
# Known bypasses of prefix rules: each must be denied, naming the command that is out of scope.
# --------------------------------------------------------------------------------------------

BYPASSES = [
    # (source, the offending command named in the verdict; None = denied as unverifiable)
    ("ls && rm -rf /", "rm -rf /"),
    ("ls || rm -rf /", "rm -rf /"),
    ("ls; rm -rf /", "rm -rf /"),
    ("ls & rm -rf /", "rm -rf /"),
    ("ls | rm -rf /", "rm -rf /"),
    ("ls |& rm -rf /", "rm -rf /"),
    ("ls\nrm -rf /", "rm -rf /"),
    ("ls\n\n  rm -rf / # tidy up", "rm -rf /"),
    ("sh -c 'rm -rf /'", "rm -rf /"),
    ("bash -c 'ls; rm -rf /'", "rm -rf /"),
    ("/bin/sh -c 'rm x'", "rm x"),
    ("dash -c 'rm x'", "rm x"),
    ("bash -lc 'rm x'", "rm x"),
    ("env python3 evil.py", "python3 evil.py"),
    ("env -i FOO=1 rm x", "rm x"),
    ("env -u HOME -- rm x", "rm x"),
    ("find . -exec rm {} \\;", "rm '{}'"),
    ("find . -execdir rm {} +", "rm '{}'"),
    ("find . -ok rm {} \\;", "rm '{}'"),
    ("timeout 5 rm x", "rm x"),
    ("timeout -s KILL --kill-after=1 5 rm x", "rm x"),
    ("/usr/bin/timeout 5 rm x", "rm x"),
    ("ls $(rm -rf /)", "rm -rf /"),
    ("ls `rm -rf /`", "rm -rf /"),
    ("ls <(rm -rf /)", "rm -rf /"),
    ("ls > >(rm -rf /)", "rm -rf /"),
    ('ls "$(rm -rf /)"', "rm -rf /"),
    ("VAR=1 rm x", "rm x"),
    ("VAR=$(rm x) ls", "rm x"),
    ("ls | xargs rm", "rm"),
    ("ls | xargs -n1 -P4 rm -f", "rm -f"),
    ("ls | xargs -I{} rm {}", "rm '{}'"),
    ("nice -n 5 rm x", "rm x"),
    ("nice -5 rm x", "rm x"),
    ("nohup rm x &", "rm x"),
    ("stdbuf -oL rm x", "rm x"),
    ("time rm x", "rm x"),
    ("command rm x", "rm x"),
    ("builtin eval 'rm x'", "rm x"),
    ("exec rm x", "rm x"),
    ("eval 'ls; rm x'", "rm x"),
    ("eval ls ';' rm x", "rm x"),
    ("watch -n 1 'ls; rm x'", "rm x"),
    ("watch -x rm x", "rm x"),
    ("flock /tmp/l rm x", "rm x"),
    ("flock -n /tmp/l -c 'rm x'", "rm x"),
    ("setsid -f rm x", "rm x"),
    ("ionice -c 3 rm x", "rm x"),
    ("taskset -c 1 rm x", "rm x"),
    ("unbuffer rm x", "rm x"),
    ("timeout 5 env nice sh -c 'xargs rm'", "rm"),
    ("(rm x)", "rm x"),
    ("{ rm x; }", "rm x"),
    ("! rm x", "rm x"),
    ("if ls; then rm x; fi", "rm x"),
    ("if ls; then ls; elif rm x; then ls; else ls; fi", "rm x"),
    ("while ls; do rm x; done", "rm x"),
    ("until rm x; do ls; done", "rm x"),
    ("for f in a b; do rm a; done", "rm a"),
    ("for f in $(rm x); do ls; done", "rm x"),
    ("case a in a) rm x;; esac", "rm x"),
    ("case $(rm x) in a) ls;; esac", "rm x"),
    ("ls > $(rm x)", "rm x"),
    ("cat <<< $(rm x)", "rm x"),
    ("ls <<< $(rm x)", "rm x"),
    ("ls <<EOF\n$(rm x)\nEOF\n", "rm x"),
    ("ls <<EOF | rm y\nbody\nEOF\n", "rm y"),
    ("ls <<EOF && rm y\nbody\nEOF\n", "rm y"),
    ("x=$(rm x)", "rm x"),
    ("x=(a $(rm x))", "rm x"),
    ("kube$(rm x)ctl get", "rm x"),
    ("ls ${x:-$(rm x)}", "rm x"),
    ("'rm' x", "rm x"),
    ('r"m" x', "rm x"),
    ("r\\m x", "rm x"),
    ("$'\\x72m' x", "rm x"),
    ("ls 2>/dev/null y; rm z", "rm z"),
    ("./timeout 5 ls", "./timeout 5 ls"),  # a local script is not the real wrapper
    ("kubectl get pods; git push", "git push"),
]


@pytest.mark.parametrize(("source", "offender"), BYPASSES)
def test_bypasses_are_denied(source: str, offender: str) -> None:
    verdict = check_scope(source, BYPASS_SCOPE)
    assert not verdict.allowed, source
    assert verdict.command == offender
    allowed = "(allowed: ls *, kubectl *, find *)"
    assert f"`{offender}` is outside this role's scope {allowed}" in verdict.reason


UNVERIFIABLE = [
    # (source, a fragment of the problem reported)
    ("$CMD get", "`$CMD` is an expansion"),
    ("${CMD} get", "`${CMD}` is an expansion"),
    ("ls $DIR", "`$DIR` is an expansion"),
    ('ls "$DIR"', "`$DIR` is an expansion"),
    ("ls $1", "`$1` is an expansion"),
    ('ls "$@"', "`$@` is an expansion"),
    ("ls $((1 + 2))", "arithmetic"),
    ("ls $[1]", "arithmetic"),
    ("l* -la", "glob in command name"),
    ("l? -la", "glob in command name"),
    ("l{s,} -la", "brace expansion"),
    ("ls {a,b}", "brace expansion"),
    ("ls x{1..3}", "brace expansion"),
    ("ls ~root/x", "tilde expansion"),
    ("ls ~+", "tilde expansion"),
    ("~/bin/tool", "tilde expansion"),
    ("f() { ls; }", "defining shell functions"),
    ("function f { ls; }", "defining shell functions"),
    ("((i++))", "arithmetic"),
    ("for ((i=0; i<3; i++)); do ls; done", "arithmetic"),
    ("a[$i]=1", "array subscripts"),
    ("ls &&", "incomplete"),
    ("ls ||", "incomplete"),
    ("ls |", "incomplete"),
    ('ls "abc', "syntax error"),
    ("ls 'abc", "syntax error"),
    ("ls $(", "syntax error"),
    ("ls; ;", "syntax error"),
    ("ls <<EOF\nno end\n", "incomplete"),
    ("(ls", "syntax error"),
    ("ls\0rm", "NUL byte"),
    ("ls\r\nrm x", "not understood"),
    ("l\\\ns -la", "not understood"),  # bash joins this into `ls`
    ("sh", "reading a script or stdin"),
    ("echo ls | sh", "reading a script or stdin"),
    ("bash script.sh", "reading a script or stdin"),
    ("bash -i", "not supported"),
    ("sh -c", "reading a script or stdin"),
    ("sh -c 'ls $X'", "in `sh -c` string: `$X` is an expansion"),
    ("sh -c 'ls' -c 'x' && bash --rcfile x", "`bash --rcfile`"),
    ("eval $CMD", "`$CMD` is an expansion"),
    ("timeout 5", "cannot tell which command"),
    ("nohup", "cannot tell which command"),
    ("env -S 'rm -rf /'", "unsupported option `-S`"),
    ("ls | xargs -I{} sh -c 'ls {}'", "contains `{}`"),
    ("find . -exec sh -c 'ls {}' \\;", "contains `{}`"),
    ("find . -exec {} \\;", "only filled in at run time"),
    ("find . -exec ls {}", "without a terminating"),
    ("ls | xargs eval", "appended at run time"),
    ("ls | xargs timeout 5", "cannot tell which command"),
    ("PATH=/tmp ls", "setting `PATH`"),
    ("LD_PRELOAD=/tmp/x.so ls", "setting `LD_PRELOAD`"),
    ("env PATH=/tmp ls", "setting `PATH`"),
    ("PATH=/tmp; ls", "setting `PATH`"),
    ("ls > /dev/tcp/10.0.0.1/80", "network socket"),
    ("ls `ls \\`ls\\``", "backslashes inside backticks"),
    ("ls <<-EOF\n\t$(ls)\nEOF\n", "here-document"),
    ("ls <<EOF\n`ls`\nEOF\n", "backticks in a here-document"),
    ("x=${y:1}", "arithmetic or indirection"),
    ("x=${!y}", "arithmetic or indirection"),
    ('x="${y@P}"', "arithmetic or indirection"),
    ("ls $'a\\0b'", "cannot decode"),
    ('ls $"hello"', "locale translation"),
    ("coproc ls", "`coproc`"),
    ("zsh -c 'rm x'", "a shell Corral does not model"),
    ("chroot / rm x", "`chroot` changes privileges"),
    ("sudo rm x", "`sudo` changes privileges"),
    ("sudo -u root kubectl delete ns prod", "`sudo` changes privileges"),
    ("sudo -s", "`sudo` changes privileges"),
    ("select x in a; do ls; done", "`select`"),
    ("ls " + "x" * MAX_SOURCE_BYTES, "longer than"),
    ("[[ x -eq 'a[$(ls)]' ]]", "evaluates arithmetic"),
    ("[ -v 'a[1]' ]", "evaluates a subscript"),
    ("sh -c " + "\"sh -c '" * 4 + "ls", "syntax error"),
]


@pytest.mark.parametrize(("source", "fragment"), UNVERIFIABLE)
def test_unverifiable_input_is_denied(source: str, fragment: str) -> None:
    parsed = parse(source)
    assert any(fragment in p for p in parsed.problems), parsed.problems
    verdict = check_scope(source, [*SCOPE, "[ *", "[[ *", "sh *", "bash *", "find *", "env *"])
    assert not verdict.allowed
    assert fragment in verdict.reason or verdict.command is not None


ALLOWED = [
    ("kubectl get pods -n x | grep foo", ("kubectl *", "grep *")),
    ("FOO=1 kubectl get x", ("kubectl *",)),
    ("timeout 5 kubectl get pods", ("kubectl *",)),
    ("'kubectl' get", ("kubectl *",)),
    ('k"ubectl" get', ("kubectl *",)),
    ("k\\ubectl get", ("kubectl *",)),
    ("$'kube\\x63tl' get", ("kubectl *",)),
    ("kubectl", ("kubectl *",)),  # a trailing * also matches no words
    ("git status", ("git status",)),
    ("ls '*.txt'", ("ls *",)),
    ("ls -la && kubectl get pods", SCOPE),
    ("kubectl get pods 2>&1 | grep -v x > out.txt", ("kubectl *", "grep *")),
    ("kubectl get pods >/dev/null 2>&1 < /dev/null", ("kubectl *",)),
    ("cat <<'EOF' > f.txt\n$(rm -rf /) `rm` ${x:1}\nEOF\n", ("cat *",)),
    ("cat <<EOF\nhello $USER ${HOME} ${#x}\nEOF\n", ("cat *",)),
    ("cat <<EOF\n$(kubectl get pods)\nEOF\n", ("cat *", "kubectl *")),
    ("ls # rm -rf /", ("ls *",)),
    ("# just a comment", ("ls *",)),
    ("ls \\\n  -la", ("ls *",)),
    ("x=1", ("ls *",)),
    ("x=$(kubectl get pods); ls", ("kubectl *", "ls *")),
    ("sh -c 'kubectl get pods && ls'", ("kubectl *", "ls *", "sh -c *")),
    ("bash -euo pipefail -c 'kubectl get pods'", ("kubectl *", "bash *")),
    ("env -i A=1 kubectl get", ("kubectl *",)),
    ("find . -name '*.py' -exec grep -l foo {} +", ("find *", "grep *")),
    ("ls | xargs -0 grep foo", ("ls *", "grep *")),
    ("command -v kubectl", ("command -v *",)),
    ("exec 2>&1", ("ls *",)),
    ("[[ -f x ]] && ls", ("[[ *", "ls *")),
    ("for f in a b; do ls -la; done", ("ls *",)),
    ("case x in a) ls;; *) kubectl get x;; esac", SCOPE),
    ("kubectl get pods -o jsonpath='{.items[*].metadata.name}'", ("kubectl *",)),
    ("duckdb -c 'select 1'", ("duckdb *",)),
    ("ray job submit -- python train.py", ("ray job submit *", "python *")),
    ('python -c "print(1)"', ("python *",)),
    ("(ls) && { kubectl get x; }", SCOPE),
    ("kubectl get pods &", ("kubectl * &",)),
]


@pytest.mark.parametrize(("source", "patterns"), ALLOWED)
def test_allowed(source: str, patterns: tuple[str, ...]) -> None:
    verdict = check_scope(source, patterns)
    assert verdict.allowed, verdict.reason
    assert verdict.command is None


def test_command_substitution_in_argument_is_denied_even_if_inner_allowed() -> None:
    verdict = check_scope("ls $(kubectl config current-context)x", SCOPE)
    assert not verdict.allowed
    assert verdict.command is None
    assert "only known at run time" in verdict.reason


# --------------------------------------------------------------------------------------------
# What parse() reports
# --------------------------------------------------------------------------------------------


def test_quoted_command_name_is_resolved() -> None:
    assert argvs("'kubectl' get") == [("kubectl", "get")]
    assert argvs('k"ubectl" get "a b" c\\ d') == [("kubectl", "get", "a b", "c d")]
    assert argvs('echo $\'a\\tb\\x41\\101\\u00e9\' "x\\"y\\$z\\q"') == [
        ("echo", "a\tbAAé", 'x"y$z\\q')
    ]


def test_unresolvable_name_is_a_problem_and_inner_command_collected() -> None:
    parsed = parse("kube$(echo ctl) get")
    assert parsed.commands == (SimpleCommand(("echo", "ctl")),)
    assert parsed.problems
    verdict = check_scope("kube$(echo ctl) get", ["kubectl *"])
    assert not verdict.allowed
    assert verdict.command == "echo ctl"


def test_dollar_var_name_denied() -> None:
    verdict = check_scope("$CMD get", ["kubectl *"])
    assert not verdict.allowed
    assert "$CMD" in verdict.reason


def test_find_exec_collects_both_commands() -> None:
    parsed = parse("find . -name x -exec rm {} \\;")
    assert parsed.problems == ()
    assert parsed.commands == (
        SimpleCommand(("find", ".", "-name", "x", "-exec", "rm", "{}", ";")),
        SimpleCommand(("rm", "{}"), ("find -exec",)),
    )
    verdict = check_scope("find . -name x -exec rm {} \\;", ["find *"])
    assert not verdict.allowed
    assert verdict.command == "rm '{}'"


def test_sh_c_names_the_offending_inner_command() -> None:
    verdict = check_scope("sh -c 'kubectl get pods; rm -rf /'", ["kubectl *"])
    assert not verdict.allowed
    assert verdict.command == "rm -rf /"
    assert verdict.reason.startswith("`rm -rf /` is outside this role's scope")
    assert parse("sh -c 'kubectl get pods; rm -rf /'").commands == (
        SimpleCommand(("kubectl", "get", "pods"), ("sh -c",)),
        SimpleCommand(("rm", "-rf", "/"), ("sh -c",)),
        SimpleCommand(("sh", "-c", "kubectl get pods; rm -rf /")),  # the shell itself, last
    )


def test_wrappers_are_recorded_in_order() -> None:
    (cmd,) = parse("timeout 5 env A=1 nice -n 2 stdbuf -oL kubectl get").commands
    assert cmd.argv == ("kubectl", "get")
    assert cmd.wrappers == ("timeout", "env", "nice", "stdbuf")


def test_newline_separated_commands() -> None:
    assert argvs("kubectl get a\nkubectl get b\n\nls") == [
        ("kubectl", "get", "a"),
        ("kubectl", "get", "b"),
        ("ls",),
    ]
    assert check_scope("kubectl get a\nrm -rf /", SCOPE).command == "rm -rf /"


def test_heredoc_body_is_data_but_its_substitutions_are_commands() -> None:
    source = "cat > notes.md <<EOF\nline $(date) and $HOME\nEOF\nkubectl get x\n"
    assert argvs(source) == [("date",), ("cat",), ("kubectl", "get", "x")]
    assert check_scope(source, ["cat *", "kubectl *"]).command == "date"
    assert check_scope(source, ["cat *", "kubectl *", "date"]).allowed


def test_quoted_heredoc_is_literal() -> None:
    parsed = parse("python3 <<'PY'\nimport os; os.system('rm -rf /')  # $(rm) `rm`\nPY\n")
    assert parsed.problems == ()
    assert parsed.commands == (SimpleCommand(("python3",)),)


def test_bytes_the_parser_drops_are_caught() -> None:
    # tree-sitter-bash silently drops the `-` here; the coverage check notices
    parsed = parse("python3 - <<'PY'\nprint(1)\nPY\n")
    assert any("not understood" in p for p in parsed.problems)


def test_redirect_words_after_destination_are_arguments() -> None:
    # tree-sitter hangs `--force` on the redirection; bash passes it to git
    assert argvs("git push >/dev/null --force") == [("git", "push", "--force")]
    assert not check_scope("git push >/dev/null --force", ["git push"]).allowed


def test_bare_assignment_runs_nothing() -> None:
    assert parse("A=1 B='x y'") == parse("")
    assert check_scope("A=1", ["ls *"]).allowed


def test_assignment_values_with_substitutions_are_collected() -> None:
    assert argvs("A=$(kubectl get x) ls") == [("kubectl", "get", "x"), ("ls",)]


def test_nesting_is_bounded() -> None:
    source = "eval " + " ".join(["eval"] * 3) + " ls"
    assert argvs(source)[0] == ("ls",)  # then each `eval`, itself a command to allow
    assert [a[0] for a in argvs(source)[1:]] == ["eval"] * 4
    parsed = parse("eval " * 10 + "ls")
    assert any("nested more than" in p for p in parsed.problems)


def test_empty_input_has_no_commands() -> None:
    assert parse("") == parse("   \n\t# nothing\n")
    assert parse("").commands == ()
    assert parse("").problems == ()


# --------------------------------------------------------------------------------------------
# check_scope policy details
# --------------------------------------------------------------------------------------------


def test_empty_pattern_list_denies_everything() -> None:
    for source in ("ls", "", "x=1"):
        verdict = check_scope(source, [])
        assert not verdict.allowed
        assert "allowed: none" in verdict.reason


def test_privilege_changes_are_refused_whatever_the_scope() -> None:
    for source in ("sudo kubectl get pods", "su -c 'kubectl get pods'", "doas ls", "pkexec ls"):
        verdict = check_scope(source, ["sudo *", "su *", "doas *", "pkexec *", "kubectl *"])
        assert not verdict.allowed and "changes privileges" in verdict.reason, source


def test_appended_arguments_need_a_rest_pattern() -> None:
    assert not check_scope("ls | xargs kubectl get pods", ["ls", "kubectl get pods"]).allowed
    assert check_scope("ls | xargs kubectl get pods", ["ls", "kubectl get pods *"]).allowed
    assert not check_scope("find . -exec ls {} +", ["find *", "ls {}"]).allowed
    assert check_scope("find . -exec ls {} \\;", ["find *", "ls {}"]).allowed


def test_problem_with_allowed_commands_reports_the_problem() -> None:
    verdict = check_scope("kubectl get $NS", ["kubectl *"])
    assert not verdict.allowed
    assert verdict.command is None
    assert verdict.reason.startswith("cannot verify this command: `$NS`")


def test_exact_pattern_does_not_allow_more_words() -> None:
    assert check_scope("git status", ["git status"]).allowed
    assert not check_scope("git status --porcelain", ["git status"]).allowed
    assert not check_scope("git", ["git status"]).allowed


# --------------------------------------------------------------------------------------------
# Patterns
# --------------------------------------------------------------------------------------------

MATCHES = [
    ("kubectl *", ("kubectl",), True),
    ("kubectl *", ("kubectl", "get", "pods"), True),
    ("kubectl *", ("kubectlx", "get"), False),
    ("kubectl get *", ("kubectl", "delete", "pods"), False),
    ("ray job submit *", ("ray", "job", "submit", "--", "python", "x.py"), True),
    ("ray job submit *", ("ray", "job", "stop"), False),
    ("git status", ("git", "status"), True),
    ("git status", ("git", "status", "-s"), False),
    ("git st*", ("git", "status"), True),
    ("git st*", ("git", "status", "-s"), False),  # a glob word matches one word only
    ("git * --dry-run", ("git", "push", "--dry-run"), True),
    ("git * --dry-run", ("git", "push", "origin", "--dry-run"), False),
    ("kubectl get*", ("kubectl", "get", "pods"), False),  # `*` in a word is a glob, not "rest"
    ("kubectl get*", ("kubectl", "get-contexts"), True),
    ("[[ *", ("[[", "-f", "x", "]]"), True),  # `[` alone is not a glob
    ("npm run test:*", ("npm", "run", "test", "--", "-k"), True),
    ("python *.py", ("python", "train.py"), True),
    ("python *.py", ("python", "-c", "x"), False),
    ("echo 'a b'", ("echo", "a b"), True),
    ("echo 'a b'", ("echo", "a", "b"), False),
]


@pytest.mark.parametrize(("pattern", "argv", "expected"), MATCHES)
def test_pattern_matching(pattern: str, argv: tuple[str, ...], expected: bool) -> None:
    assert parse_pattern(pattern).matches(argv) is expected


def test_pattern_is_matched_word_wise_not_on_the_string() -> None:
    # a prefix rule "ls" would have allowed this; word-wise matching on argv does not
    assert not check_scope("lsof -i", ["ls *"]).allowed
    assert parse_pattern("ls *") == Pattern("ls *", ("ls",), True)


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("", "must not be empty"),
        ("   ", "must not be empty"),
        ("*", "would allow every command"),
        ("* *", "must be literal"),
        ("kube* get", "must be literal"),
        ("ls 'unterminated", "cannot be split"),
        ("ls\nrm", "control character"),
    ],
)
def test_bad_patterns_raise(pattern: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_pattern(pattern)
    with pytest.raises(ValueError, match=message):
        check_scope("ls", [pattern])
