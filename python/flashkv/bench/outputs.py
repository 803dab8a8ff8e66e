"""Writing a benchmark document where the command line asked: --json, --md and --plots (shared
by ``python -m flashkv.bench`` and the peers' command line)."""

from . import report


def write_outputs(doc, json_path, md_path, plots_dir, log):
    if json_path:
        report.write_json(doc, json_path)
        log(f"wrote {json_path}")
    if md_path:
        with open(md_path, "w") as f:
            f.write(report.markdown(doc))
        log(f"wrote {md_path}")
    if plots_dir:
        from . import plot  # matplotlib only when plots are asked for

        try:
            for path in plot.plot_results(doc, plots_dir):
                log(f"wrote {path}")
        except ImportError as e:
            log(f"--plots: matplotlib is needed ({e}); no plots drawn")
