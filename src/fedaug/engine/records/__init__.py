"""What a run leaves: its directory (:mod:`~fedaug.engine.records.rundir`), the lock that keeps one writer
(:mod:`~fedaug.engine.records.runlock`), tracking backends (:mod:`~fedaug.engine.records.tracking`) and the
progress display (:mod:`~fedaug.engine.records.progress`). The round loop reports to them."""

from fedaug.engine.records.rundir import (ASIDE, CHECKPOINT_FORMAT, CHECKPOINT_KEYS, CKPT_DIR, CONFIG, ENVIRONMENT,
                                          METRICS, METRICS_GZ, REPORT, SUMMARY, RunDir, checkpoint_problem,
                                          read_records)

__all__ = ["ASIDE", "CHECKPOINT_FORMAT", "CHECKPOINT_KEYS", "CKPT_DIR", "CONFIG", "ENVIRONMENT", "METRICS",
           "METRICS_GZ", "REPORT", "SUMMARY", "RunDir", "checkpoint_problem", "read_records"]
