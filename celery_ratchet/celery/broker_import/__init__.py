"""Moving the task messages a Celery broker holds into the job store (``ratchet
import-broker``): the cutover from a broker."""
