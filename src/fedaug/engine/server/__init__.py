"""The server's side of a round: the loop (:mod:`~fedaug.engine.server.loop`), the exchange of one phase with
a fleet (:mod:`~fedaug.engine.server.exchange`), the update screening (:mod:`~fedaug.engine.server.screening`),
client sampling (:mod:`~fedaug.engine.server.schedule`), evaluation summaries
(:mod:`~fedaug.engine.server.evaluation`) and fine-tuning's senders (:mod:`~fedaug.engine.server.finetune`)."""

from fedaug.engine.server.loop import PLACEMENT, RESUME_ENVIRONMENT, Federation, Server, state_problems

__all__ = ["PLACEMENT", "RESUME_ENVIRONMENT", "Federation", "Server", "state_problems"]
