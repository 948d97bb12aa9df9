"""Several ways of writing the same pyscipopt program, so the data does not teach one template.

Every family writes its program in the one layout of `program` (the layout bug injection and
the judge rely on). `restyle` then rewrites it in one of several equivalent styles, chosen from
the program text itself (so the same instance always gets the same style):

| dimension | styles |
| --- | --- |
| import | `from pyscipopt import Model, quicksum` / `import pyscipopt as scip` (`scip.Model`, `scip.quicksum`) |
| model name | `model` / `mdl` / `prob` / `scip_model` (renamed as a Python name, never inside strings) |
| report | a `show()` helper / an inline loop / a `solution` dict printed at the end |
| library | pyscipopt / PuLP / Pyomo / coptpy (`solver_libraries.translate`; the import style applies to pyscipopt only) |
| data | the data block as literals / nested rows and `zip` / records (`data_layout.relayout`) |

Renaming goes through a scanner of Python's tokens (`_TOKEN`), so only names change. The restyled program is what the
sandbox runs during verification, so every style is checked like the original.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

from trex.workloads.or_data.data_layout import LAYOUTS, relayout
from trex.workloads.or_data.solver_libraries import translate

IMPORTS = ("from", "alias")
MODEL_NAMES = ("model", "mdl", "prob", "scip_model")  # scip_model becomes problem in other libraries
REPORTS = ("helper", "inline", "dict")


@dataclass(frozen=True)
class CodeStyle:
    imports: str = "from"
    model_name: str = "model"
    report: str = "helper"
    library: str = "pyscipopt"
    data: str = "literal"

    @property
    def key(self) -> str:
        data = "" if self.data == "literal" else f"/{self.data}"
        if self.library != "pyscipopt":
            return f"{self.library}/{self.model_name}/{self.report}{data}"
        return f"{self.imports}/{self.model_name}/{self.report}{data}"


def style_for(program: str, library: str = "pyscipopt") -> CodeStyle:
    """A style chosen by a hash of the program text (deterministic per instance), in `library`."""
    digest = int.from_bytes(hashlib.sha256(program.encode("utf-8")).digest()[:8], "big")
    imports = IMPORTS[digest % len(IMPORTS)]
    model_name = MODEL_NAMES[(digest // 7) % len(MODEL_NAMES)]
    report = REPORTS[(digest // 101) % len(REPORTS)]
    data = LAYOUTS[(digest // 1009) % len(LAYOUTS)]
    if library != "pyscipopt" and model_name == "scip_model":
        model_name = "problem"  # a PuLP, Pyomo or COPT model is not a SCIP model
    return CodeStyle(imports, model_name, report, library, data)


_HELPER = """

def show(label, var):
    level = model.getVal(var)
    if abs(level) > 1e-6:
        print(f"{label} = {level:.10g}")
"""
_SHOW_CALL = re.compile(r"^(\s*)show\((.+), ([^,]+)\)$")


def restyle(program: str, style: CodeStyle | None = None) -> str:
    """`program` in `style` (default: `style_for(program)`); the default style returns it unchanged.
    The data block is laid out first, then the report restyled (on the pyscipopt layout), then the
    library translated, then the model renamed. Raises `solver_libraries.TranslationError` when the library cannot be used."""
    style = style or style_for(program)
    text = relayout(program, style.data)
    if style.report != "helper":
        text = _report(text, style.report)
    renames: dict[str, str] = {}
    if style.library != "pyscipopt":
        text = translate(text, style.library)
    elif style.imports == "alias":
        text = text.replace("from pyscipopt import Model, quicksum\n", "import pyscipopt as scip\n", 1)
        renames.update({"Model": "scip.Model", "quicksum": "scip.quicksum"})
    if style.model_name != "model":
        renames["model"] = style.model_name
    # one tokenizing pass for every rename (none of the new names is one of the old ones)
    return _rename(text, renames) if renames else text


def _report(text: str, report: str) -> str:
    if _HELPER not in text:
        return text
    text = text.replace(_HELPER, "")
    lines = text.split("\n")
    out: list[str] = []
    dict_mode = report == "dict"
    for line in lines:
        match = _SHOW_CALL.match(line)
        if match is None:
            out.append(line)
            continue
        indent, label, var = match.groups()
        if dict_mode:
            out.append(f"{indent}solution[{label}] = model.getVal({var})")
        else:
            out += [
                f"{indent}if abs(model.getVal({var})) > 1e-6:",
                f'{indent}    print({label}, "=", f"{{model.getVal({var}):.10g}}")',
            ]
    text = "\n".join(out)
    if dict_mode:
        marker = 'if status == "optimal":\n'
        text = text.replace(marker, "solution = {}\n" + marker, 1)
        ending = '    print(f"Optimal objective value: {status}")\n'
        text = text.replace(
            ending,
            ending
            + 'for label, level in solution.items():\n    if abs(level) > 1e-6:\n        print(f"{label} = {level:.10g}")\n',
            1,
        )
    return text


# Python's tokens as far as renaming needs them, in `tokenize`'s precedence: comments and strings
# (with their prefixes, triple-quoted first) are passed over whole, numbers so that their "." is not
# an attribute access, "..." so that it is not one either; runs of other operators are one match,
# and white space and line continuations none (`finditer` steps over them). `tokenize` itself is pure Python and cost
# about 22 of the 30 CPU ms per sample that restyling took (bench/RESULTS.md section 6); this scanner
# makes the same edits (`tests/workloads/test_or_data_speed.py` compares the two).
_TOKEN = re.compile(
    r"""
    (?P<comment>\#[^\n]*)
    | (?P<string>[rRbBuUfF]{0,2}(?:'\'\'(?:\\.|[^\\])*?'\'\'|\"\"\"(?:\\.|[^\\])*?\"\"\"
                                  |'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*"))
    | (?P<name>[^\W\d]\w*)
    | (?P<number>0[xXoObB][0-9a-fA-F_]+|(?:\d[\d_]*(?:\.[\d_]*)?|\.\d[\d_]*)(?:[eE][+-]?\d[\d_]*)?[jJ]?)
    | (?P<ellipsis>\.\.\.)
    | (?P<other>\.|[^\w\s\\.'"\#]+)
    """,
    re.VERBOSE | re.DOTALL,
)


def _rename(text: str, names: dict[str, str]) -> str:
    """Replace NAME tokens (not attribute names after a dot, not strings or comments)."""
    pieces: list[str] = []
    done = 0
    after_dot = False
    fields = [(re.compile(r"(?<![\w.])" + re.escape(old) + r"(?=[.(\[])"), new) for old, new in names.items()]
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind == "comment":
            continue
        token = match.group()
        if kind == "name":
            if token in names and not after_dot:
                pieces += [text[done : match.start()], names[token]]
                done = match.end()
        elif kind == "string" and token[:1] in "fF" and "\n" not in token and any(old in token for old in names):
            changed = token
            for pattern, new in fields:  # names used inside an f-string's replacement fields
                changed = re.sub(r"\{[^{}]*\}", lambda field, p=pattern, n=new: p.sub(n, field.group(0)), changed)
            if changed != token:
                pieces += [text[done : match.start()], changed]
                done = match.end()
        after_dot = token == "."
    pieces.append(text[done:])
    return "".join(pieces)
