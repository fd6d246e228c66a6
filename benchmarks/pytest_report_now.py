"""A pytest plugin for the device runs: each failure's traceback as it happens, with the time and its duration,
and every call slower than 20 s. Under pytest-xdist, pytest's own summary (and so every traceback) comes only at the
end, and a run cut by the device's step limit never gets there (sessions 32 and 33).
Use: PYTHONPATH=benchmarks:$PYTHONPATH python3 -m pytest -p pytest_report_now ..."""
import sys
import time

START = time.monotonic()


def pytest_runtest_logreport(report):
    at = f"[{time.monotonic() - START:6.1f} s]"
    if report.failed:
        sys.stdout.write(f"\n{at} FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n"
                         f"{report.longreprtext[-5000:]}\n{at} end of {report.nodeid}\n")
    elif report.when == "call" and report.duration > 20:
        sys.stdout.write(f"\n{at} slow {report.nodeid}: {report.duration:.1f} s\n")
    sys.stdout.flush()
