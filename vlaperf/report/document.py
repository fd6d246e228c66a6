"""The report's document model and what every section of it shares: `Doc` (blocks written out as HTML or markdown),
how a value reads in a table cell, how a result file names its workload and GPU, and the plots' common pieces
(matplotlib is an extra: `plots_available`)."""

from __future__ import annotations

import base64
import functools
import html
import io
import json
import math
from pathlib import Path
from typing import Any
from urllib.parse import quote

# how a table or plot names a lever when a variant's full spelling would not fit (short_variant)
LEVER_ABBREVIATIONS = {
    "for_loop": "loop", "skip_masked_images": "skipimg", "trim_prompt_padding": "trim", "static_kv_cache": "kv",
    "sdpa": "sdpa", "fuse_projections": "fuse", "cuda_graph": "graph", "compile_layers": "layers",
    "triton_kernels": "triton", "megakernel": "mega",
    # the world-action model's levers (vlaperf.engine.wam)
    "host_schedule": "host", "cached_keep_index": "keepidx", "sparse_sampler": "sparse",
    "context_kv_cache": "ctxkv", "video_kv_cache": "vidkv", "group_modulation": "groupmod",
    "flash_actions": "flashact"}
# the plots' series colours, in order
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"]


# ----------------------------------------------------------------- document model


class Doc:
    """Blocks of a report, written out as HTML or markdown at the end."""

    def __init__(self):
        self.blocks: list[tuple] = []

    def extend(self, other: "Doc") -> None:
        """Append another document's blocks (a section rendered on its own first, so that a
        renderer that fails half way leaves nothing behind)."""
        self.blocks += other.blocks

    def h(self, level: int, text: str) -> None:
        self.blocks.append(("h", level, text))

    def p(self, text: str, cls: str = "") -> None:
        self.blocks.append(("p", text, cls))

    def table(self, headers: list[str], rows: list[list[Any]]) -> None:
        self.blocks.append(("table", headers, rows))

    def fig(self, fig, alt: str) -> None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        self.blocks.append(("img", buf.getvalue(), alt))  # numbered when written: sections are merged first

    def pre(self, text: str) -> None:
        self.blocks.append(("pre", text))

    # -- writers

    def html(self, title: str) -> str:
        out = [
            "<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>", f"<title>{html.escape(title)}</title>",
            "<style>body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;max-width:1200px;margin:2em auto;"
            "padding:0 1em;color:#222}table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:13px}"
            "th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;vertical-align:top}"
            "th{background:#f2f2f2}td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block;"
            "margin:.5em 0}h2{border-bottom:2px solid #ddd;padding-bottom:.2em;margin-top:2em}.note{color:#555;"
            "font-size:13px}.warn{color:#a33}pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:12px}"
            "</style></head><body>",
            f"<h1>{html.escape(title)}</h1>",
        ]
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                out.append(f"<h{b[1]}>{html.escape(b[2])}</h{b[1]}>")
            elif kind == "p":
                cls = f" class='{b[2]}'" if b[2] else ""
                out.append(f"<p{cls}>{html.escape(b[1])}</p>")
            elif kind == "pre":
                out.append(f"<pre>{html.escape(b[1])}</pre>")
            elif kind == "table":
                out.append("<table><thead><tr>" + "".join(f"<th>{html.escape(str(x))}</th>" for x in b[1]) + "</tr></thead><tbody>")
                for row in b[2]:
                    out.append("<tr>" + "".join(f"<td>{html.escape(cell(x))}</td>" for x in row) + "</tr>")
                out.append("</tbody></table>")
            elif kind == "img":
                data = base64.b64encode(b[1]).decode("ascii")
                out.append(f"<img alt='{html.escape(b[2])}' src='data:image/png;base64,{data}'>")
        out.append("</body></html>")
        return "\n".join(out) + "\n"

    def markdown(self, title: str, out_path: Path) -> str:
        files_dir = out_path.with_name(out_path.stem + "_files")
        # an earlier report's figures (fig01.png .. fig180.png): those past this one's stayed
        for old in files_dir.glob("fig[0-9][0-9]*.png"):
            if old.stem[3:].isdigit():
                old.unlink()
        lines = [f"# {md_text(title)}", ""]
        images = 0
        for b in self.blocks:
            kind = b[0]
            if kind == "h":
                lines += ["#" * (b[1] + 1 if b[1] == 1 else b[1]) + " " + md_text(b[2]), ""]
            elif kind == "p":
                lines += [("_" + md_text(b[1]) + "_") if b[2] == "note" else md_text(b[1]), ""]
            elif kind == "pre":
                lines += ["```", b[1], "```", ""]
            elif kind == "table":
                lines.append("| " + " | ".join(md_cell(x) for x in b[1]) + " |")
                lines.append("|" + "|".join("---" for _ in b[1]) + "|")
                for row in b[2]:
                    lines.append("| " + " | ".join(md_cell(cell(x)) for x in row) + " |")
                lines.append("")
            elif kind == "img":
                images += 1
                files_dir.mkdir(parents=True, exist_ok=True)
                name = f"fig{images:02d}.png"
                (files_dir / name).write_bytes(b[1])
                # URL-encoded: a space in the report's name ("my report.md") would end the link
                lines += [f"![{md_text(b[2]).replace('[', '(').replace(']', ')')}]({quote(files_dir.name)}/{name})", ""]
        return "\n".join(lines)


def workload_label(r: dict) -> str:
    """The workload's id and what the run changed of it, e.g. "libero-pi05 (horizon 50)", and "RTC guided" for a
    timed guided call of real-time chunking."""
    w = r.get("workload") or {}
    o = w.get("overrides") or {}

    def value(v):  # per-sample values (prompt_valid) as one number where every sample has it
        if isinstance(v, (list, tuple)):
            return str(v[0]) if v and all(x == v[0] for x in v) else "/".join(map(str, v))
        return str(v)

    if w.get("id") is None:  # doctor's environment-only run has no workload
        return "-"
    parts = [f"{k} {value(v)}" for k, v in sorted(o.items())]
    if r.get("rtc"):  # `bench --rtc`: the guided call of real-time chunking, a workload of its own in every table
        parts.append("RTC guided")
    return str(w.get("id")) + (" (" + ", ".join(parts) + ")" if parts else "")


def sci(x: Any) -> str:
    """An error such as a rel L2 in one-digit scientific notation; "-" where the file has null (a non-finite
    error). Anything else is a damaged file: the ValueError leaves its row out, with the reason."""
    if x is None:
        return "-"
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        raise ValueError(f"rel_l2: expected a number or null, got {type(x).__name__} {x!r}")
    return f"{x:.1e}"


def cell(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if math.isnan(x):
            return "nan"
        if x == 0:
            return "0"
        a = abs(x)
        if a >= 1e6 or math.isinf(x):  # out of any timing's range (a file someone edited): short, not 300 digits
            return f"{x:.4g}"
        if a >= 100:
            return f"{x:.1f}"
        if a >= 1:
            return f"{x:.3f}"
        return f"{x:.3g}"
    if isinstance(x, (dict, list)):
        return json.dumps(x, default=str)
    return str(x)


def md_text(text: str) -> str:
    """Text from result files as markdown: no raw HTML. A label such as `<img onerror=...>` would run in viewers
    that render inline HTML (mkdocs, IDE previews); as `&lt;img ...` it shows as typed (the HTML report escapes).
    Only `<` opens a tag, so `>` and `&` stay as they are, readable in the file itself ("1024 -> 32")."""
    return str(text).replace("<", "&lt;")


def md_cell(text: str) -> str:
    """A markdown table cell: as md_text, on one line, its pipes escaped."""
    return md_text(text).replace("|", "\\|").replace("\n", " ")


# ----------------------------------------------------------------- helpers


@functools.cache
def plots_available() -> bool:
    """Whether matplotlib imports here. It is an extra (`vlaperf[plots]`), not a dependency: without it a report
    keeps its tables and leaves the plots out, saying so at the top."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def new_figure(w: float = 7.0, h: float = 3.6, ncols: int = 1, nrows: int = 1, layout: str | None = None):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=100, layout=layout)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, axes


def fixed_margins(fig, nrows: int, ncols: int, top: float, bottom: float, left: float, right: float,
                   row_gap: float, col_gap: float) -> None:
    """Place a grid of panels with margins and gaps given in inches. For figures whose text has a
    known size (the histograms' three 7-point title lines), this does what constrained layout does
    without measuring every tick label of every panel (two images of 14 files: 3.3 -> 2.5 s)."""
    w, h = fig.get_size_inches()
    panel_h = (h - top - bottom - (nrows - 1) * row_gap) / nrows
    panel_w = (w - left - right - (ncols - 1) * col_gap) / ncols
    fig.subplots_adjust(left=left / w, right=1 - right / w, top=1 - top / h, bottom=bottom / h,
                        hspace=row_gap / panel_h, wspace=col_gap / panel_w)


def table_names(specs: list[str], longest: int) -> list[str]:
    """A table's variant names: as given while every one is shorter than `longest` characters, else every one
    shortened (`short_variant`), so that one table never names a lever two ways ('for_loop,skip_masked_images'
    above 'loop+skipimg+trim+kv')."""
    if all(len(s) < longest for s in specs):
        return list(specs)
    return [short_variant(s) for s in specs]


def short_variant(spec: str) -> str:
    if spec in ("reference", "none", ""):
        return "reference"
    parts = [p for p in spec.replace("+", ",").split(",") if p]
    if len(parts) == 1 and len(spec) <= 36:
        return spec
    return "+".join(LEVER_ABBREVIATIONS.get(p, p.replace("compile=", "c:")) for p in parts)


def clip(text: str, n: int) -> str:
    """`text` cut to `n` characters, the cut marked (plot titles and legends have no room to wrap)."""
    text = str(text)
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def pct(share) -> str | None:
    """A fraction as the CLI prints it: 0.0805 -> "8.0%"; None stays None ("-")."""
    return None if share is None else f"{100 * share:.1f}%"


def gpu_name(r: dict) -> str:
    env = r.get("env") or {}
    return env.get("gpu") or env.get("device") or "cpu"
