"""The benchmarks' printed tables: one markdown table from a header and rows of values."""


def md_table(header, rows, formats) -> str:
    """``header``: column titles; ``rows``: sequences of values; ``formats``: one format spec per
    column ("" for str()). A missing value (None) prints as "-"."""
    def cell(value, spec):
        return "-" if value is None else format(value, spec) if spec else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v, f) for v, f in zip(row, formats)) + " |" for row in rows]
    return "\n".join(lines)
