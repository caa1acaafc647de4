import sys
from pathlib import Path
p = Path(sys.argv[1]) / "docs/layout.md"
s = p.read_text()
lines = s.split("\n")
a = next(i for i, l in enumerate(lines) if l.startswith("  analysis/"))
b = next(i for i, l in enumerate(lines) if l.startswith("bench/"))
lines[a:b] = (Path(__file__).parent / "layout_tree.md").read_text().rstrip("\n").split("\n")
s = "\n".join(lines)
i = s.index("## Import layers")
j = s.find("\n## ", i + 5)
rest = s[j:] if j != -1 else "\n"
s = s[:i] + (Path(__file__).parent / "layout_table.md").read_text().rstrip("\n") + "\n" + rest.lstrip("\n") if j != -1 else s[:i] + Path("/tmp/layout_table.md").read_text()
p.write_text(s)
