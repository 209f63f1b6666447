#!/usr/bin/env python3
"""No function body in src/ longer than LIMIT lines (the design card's rule: a function does one thing).

A function is a line ending in '{' whose statement has a parameter list and is not a control statement, a type,
a namespace, a lambda or an initializer; its body runs to the matching '}'. The sources are clang-formatted, so
this brace view is exact enough; EXCEPTIONS lists any function allowed to be longer, with the reason.
"""
import os
import re
import sys

LIMIT = 60
EXCEPTIONS = {}  # "src/<path>:<function name>": "why"

CONTROL = re.compile(r"(if|for|while|switch|else|do|try|catch|namespace|struct|class|enum|union|extern)\b")
LAMBDA_END = re.compile(r"\]\s*(\(.*\))?\s*(mutable)?\s*(->.*)?\{$")


def functions(lines):
    """(first line index, body length, signature text) of each function definition."""
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        k = i  # the statement's first line: back to a blank line, a comment or the end of the previous one
        while k > 0 and lines[k - 1].strip() and not lines[k - 1].strip().endswith((";", "}", "{", "*/")) \
                and not lines[k - 1].strip().startswith("//"):
            k -= 1
        head = " ".join(x.strip() for x in lines[k:i + 1])
        if (s.endswith("{") and "(" in head and not CONTROL.match(s) and not s.startswith(("}", "[", "//"))
                and "=" not in s.split("(")[0] and "return" not in s and not LAMBDA_END.search(s)):
            depth, j = 0, i
            while j < len(lines):
                depth += lines[j].count("{") - lines[j].count("}")
                if depth <= 0:
                    break
                j += 1
            yield i, j - i, head
        i += 1


def main(root):
    problems, count = [], 0
    for dirpath, _, names in os.walk(os.path.join(root, "src")):
        for f in sorted(names):
            if not f.endswith((".cpp", ".hpp", ".c")):
                continue
            path = os.path.join(dirpath, f)
            rel = os.path.relpath(path, root)
            with open(path) as fh:
                lines = fh.read().split("\n")
            for i, n, head in functions(lines):
                count += 1
                m = re.search(r"([A-Za-z_][A-Za-z_0-9:~]*)\s*\(", head)
                name = m.group(1) if m else "?"
                if n > LIMIT and f"{rel}:{name}" not in EXCEPTIONS:
                    problems.append(f"{rel}:{i + 1}: {name} is {n} lines (limit {LIMIT})")
    for p in problems:
        print("FAIL: " + p)
    if problems:
        return 1
    print(f"PASS: {count} functions in src/, none over {LIMIT} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main(os.path.abspath(sys.argv[1])))
