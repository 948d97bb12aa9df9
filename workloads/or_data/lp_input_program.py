"""The program of an LP-file task in the file's own words.

An LP -> code task gives only the LP file: no story, no nouns, no units. Its reference program is
the family's program with the instance's data, so it used to carry the story's words: element
names the file spells otherwise ('Retail Region North' for `retail_region_north`) and comments
such as "pallets of retail region c's demand handled by warehouse s" or "tons bought from source s"
(the Seventh review's #14, #27). A model cannot learn to read those from the file, so they teach
it to invent them. Here the program is rewritten with what the file gives:

- every element string in the data becomes the key the file uses (`'North Grid'` -> `'north_grid'`),
  consistently, so the program builds and solves the same model;
- a comment over a variable block names the file's variables of that family and their type; a
  comment over a constraint block says what the family's rows do, read from their coefficients
  (`row_shapes`); the objective's comment gives only the sense; other comments (data notes such as
  "every maximal way to cut one steel bar") are dropped, since the file does not say them.

The data identifiers (`sources`, `warehouses`) stay: they are names a reader gives the key lists,
not facts claimed about the input.
"""

from __future__ import annotations

import re
from collections import Counter

from trex.workloads.or_data.linear_model import LinearModel, family_of
from trex.workloads.or_data.row_shapes import shape

# What each row shape says, without the row's numbers (a comment sits over a loop of many rows).
_SHAPE_WORDS = {
    "bound": "each row bounds one variable",
    "choice": "exactly one of each row's binaries is 1",
    "exclusion": "at most one of each row's binaries is 1",
    "at_most": "each row caps how many of its binaries may be 1",
    "cover": "each row asks for at least a number of its binaries to be 1",
    "switch": "each row lets its other terms be nonzero only when its binary is 1",
    "big_m": "a large coefficient on a binary switches each row on or off (a big-M term)",
    "balance": "in each row the plus-sign terms equal the minus-sign terms plus the right-hand side",
    "total": "each row's terms add up to exactly its right-hand side",
    "limit": "each row keeps a weighted sum at or below its right-hand side",
    "requirement": "each row's weighted sum must reach its right-hand side",
    "comparison": "each row keeps one group of variables at or above (or below) another",
}
_KIND_WORDS = {"binary": "binary", "integer": "integer", "continuous": "continuous"}
_COMMENT = re.compile(r"^(\s*)#\s?(.*)$")
_HEAD = re.compile(r"^([A-Za-z_]\w*)")
# the LP name a block gives its variables or rows, in any of the four libraries' spellings:
# `name=f"open[{s}]"`, `pulp.LpVariable(f"load[{j}]"`, `..., f"load[{i},{j}]"`, `model.load_rows = pyo.Var(`
_NAMED = re.compile(r"""\bf?["']([A-Za-z_]\w*)(?:\[|["'])""")
_PYOMO = re.compile(r"\bmodel\.([A-Za-z_]\w*?)(?:_rows)?\s*=\s*pyo\.")
_VARIABLE_CODE = re.compile(r"\baddVar\(|\bLpVariable\(|\bpyo\.Var\(")
_ROW_CODE = re.compile(r"\baddCons\(|\baddConstr\(|\bmodel \+=|\+= |\bConstraintList\(|\badd_row\(|\bpyo\.Constraint\(")


def lp_input_program(program: str, model: LinearModel, key_names: dict[str, str]) -> str:
    """`program` with the file's element keys and comments from the file alone (module docstring).
    `key_names` maps the file's keys to the element names the program's data spells
    (`explain.key_names`)."""
    text = program
    for key, element in sorted(key_names.items(), key=lambda item: -len(item[1])):
        if key != element and isinstance(element, str):
            text = text.replace(repr(element), repr(key))
    kinds = {variable.name: variable.kind for variable in model.variables}
    variable_kinds: dict[str, Counter] = {}
    for variable in model.variables:
        variable_kinds.setdefault(family_of(variable.name), Counter())[variable.kind] += 1
    row_shapes: dict[str, Counter] = {}
    first_row: dict[str, str] = {}
    plain: dict[str, bool] = {}  # every coefficient 1: a plain sum, not a weighted one
    for row in model.rows:
        family = family_of(row.name)
        row_shapes.setdefault(family, Counter())[shape(row, kinds)] += 1
        plain[family] = plain.get(family, True) and all(coef == 1 for _, coef in row.terms)
        first_row.setdefault(family, row.name)
    lines = []
    source = text.split("\n")
    for number_, line in enumerate(source):
        match = _COMMENT.match(line)
        if not match:
            lines.append(line)
            continue
        indent, comment = match.groups()
        # the families the block under the comment names (`name=f"open[{s}]"`): a program may call its
        # variables otherwise (`is_open` for the file's `open`)
        block = []
        for following in source[number_ + 1 :]:
            if not following.strip():
                break
            block.append(following)
        code = "\n".join(block)
        named = list(dict.fromkeys(_NAMED.findall(code) + _PYOMO.findall(code)))
        kinds = {"variables"} if _VARIABLE_CODE.search(code) else set()
        kinds |= {"rows"} if _ROW_CODE.search(code) else set()
        rewritten = _comment(comment, named, kinds, model.sense, variable_kinds, row_shapes, plain, first_row)
        if rewritten is not None:
            lines.append(f"{indent}# {rewritten}")
    return "\n".join(lines)


def _comment(
    comment: str,
    block_names: list[str],
    kinds: set[str],
    sense: str,
    variables: dict[str, Counter],
    rows: dict[str, Counter],
    plain: dict[str, bool],
    first_row: dict[str, str],
) -> str | None:
    """The comment in the file's words, or None to drop it. `block_names` are the LP names the code
    under the comment gives its variables or rows; `kinds` says which of the two it builds."""
    if comment.strip() == "Data":
        return "Data"
    if comment.startswith("Objective"):
        return f"Objective: {sense} the file's objective"
    in_comment = re.findall(r"\b([A-Za-z_]\w*)\[", comment)
    head = _HEAD.match(comment)
    named = [name for name in block_names + in_comment if name in variables] if "variables" in kinds else []
    families = [name for name in block_names if name in rows] if "rows" in kinds else []
    if "rows" in kinds and head and head.group(1) in rows and comment[len(head.group(1)) :].startswith(":"):
        families = [head.group(1), *families]  # the comment names the family the block builds
    parts = []
    named = list(dict.fromkeys(named))
    if named:
        typed = " and ".join(
            f"`{name}__…` ({_KIND_WORDS.get(variables[name].most_common(1)[0][0], 'continuous')})" for name in named
        )
        parts.append(", ".join(f"{name}[…]" for name in named) + f": the file's variables {typed}")
    for family in dict.fromkeys(families):
        shapes = rows[family].most_common()
        words = (
            _SHAPE_WORDS[shapes[0][0]]
            if len(shapes) == 1
            else "; ".join(f"{count} of them: {_SHAPE_WORDS[kind]}" for kind, count in shapes)
        )
        if plain[family]:
            words = words.replace("weighted sum", "plain sum")
        if sum(rows[family].values()) == 1:  # one row: "its", not "each row's"
            words = words.replace("in each row ", "in it ").replace("each row's", "its").replace("each row", "it")
            parts.append(f"{family}: the file's row `{first_row[family]}`: {words}")
        else:
            parts.append(f"{family}: the file's rows `{family}__…`: {words}")
    return "; ".join(parts) or None
