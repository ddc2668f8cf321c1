-- celery_ratchet schema for mysql. Generated from celery_ratchet/store/schema.py;
-- `ratchet schema show --dialect mysql` prints it. Do not edit by hand.

CREATE TABLE scheduler_batch (
	batch_id VARCHAR(255) NOT NULL,
	kind VARCHAR(16) NOT NULL,
	name VARCHAR(255),
	state VARCHAR(16) NOT NULL,
	total INTEGER,
	added INTEGER NOT NULL DEFAULT '0',
	done INTEGER NOT NULL DEFAULT '0',
	failed INTEGER NOT NULL DEFAULT '0',
	written INTEGER NOT NULL DEFAULT '0',
	lease_until DATETIME(6),
	progress_written SMALLINT NOT NULL DEFAULT '0',
	progress_ended SMALLINT NOT NULL DEFAULT '0',
	on_success MEDIUMTEXT,
	on_failure MEDIUMTEXT,
	on_progress MEDIUMTEXT,
	created_at DATETIME(6) NOT NULL,
	finished_at DATETIME(6),
	PRIMARY KEY (batch_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE INDEX ix_scheduler_batch_state ON scheduler_batch (state, kind, created_at);

CREATE TABLE scheduler_batch_part (
	batch_id VARCHAR(255) NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	position INTEGER,
	state VARCHAR(16) NOT NULL,
	result MEDIUMTEXT,
	finished_at DATETIME(6) NOT NULL,
	PRIMARY KEY (batch_id, job_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE scheduler_control (
	id BIGINT NOT NULL AUTO_INCREMENT,
	command VARCHAR(255) NOT NULL,
	arguments MEDIUMTEXT NOT NULL,
	destination TEXT,
	pattern VARCHAR(255),
	matcher VARCHAR(64),
	ticket VARCHAR(64),
	created_at DATETIME(6) NOT NULL,
	expires_at DATETIME(6) NOT NULL,
	PRIMARY KEY (id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE INDEX ix_scheduler_control_expires ON scheduler_control (expires_at);

CREATE TABLE scheduler_control_reply (
	id BIGINT NOT NULL AUTO_INCREMENT,
	ticket VARCHAR(64) NOT NULL,
	hostname VARCHAR(255) NOT NULL,
	reply MEDIUMTEXT NOT NULL,
	expires_at DATETIME(6) NOT NULL,
	PRIMARY KEY (id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE INDEX ix_scheduler_control_reply_expires ON scheduler_control_reply (expires_at);

CREATE INDEX ix_scheduler_control_reply_ticket ON scheduler_control_reply (ticket, id);

CREATE TABLE scheduler_dlq_alert (
	task_name VARCHAR(255) NOT NULL,
	opened_at DATETIME(6),
	failed INTEGER NOT NULL DEFAULT '0',
	newest_job_id VARCHAR(255),
	newest_error MEDIUMTEXT,
	newest_at DATETIME(6),
	first_opened_at DATETIME(6),
	alerts_sent INTEGER NOT NULL DEFAULT '0',
	last_sent_at DATETIME(6),
	last_alert_id VARCHAR(255),
	last_count INTEGER,
	PRIMARY KEY (task_name)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE scheduler_group_result (
	group_id VARCHAR(255) NOT NULL,
	result MEDIUMTEXT NOT NULL,
	created_at DATETIME(6) NOT NULL,
	PRIMARY KEY (group_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE scheduler_job (
	id BIGINT NOT NULL AUTO_INCREMENT,
	job_id VARCHAR(255) NOT NULL,
	task_name VARCHAR(255) NOT NULL,
	queue VARCHAR(255) NOT NULL,
	status VARCHAR(16) NOT NULL,
	job_type VARCHAR(24) NOT NULL DEFAULT 'SINGLE',
	priority SMALLINT NOT NULL,
	scheduled_time DATETIME(6) NOT NULL,
	created_at DATETIME(6) NOT NULL,
	expires_at DATETIME(6),
	attempts INTEGER NOT NULL DEFAULT '0',
	claims INTEGER NOT NULL DEFAULT '0',
	root_id VARCHAR(255),
	parent_id VARCHAR(255),
	group_id VARCHAR(255),
	depends_on VARCHAR(255),
	business_key VARCHAR(255),
	schedule_spec TEXT,
	resource VARCHAR(255),
	tags TEXT,
	revoke_requested VARCHAR(16),
	picked_by VARCHAR(255),
	claim_token VARCHAR(32),
	claimed_at DATETIME(6),
	started_at DATETIME(6),
	finished_at DATETIME(6),
	payload MEDIUMBLOB NOT NULL,
	content_type VARCHAR(128) NOT NULL,
	content_encoding VARCHAR(64) NOT NULL,
	headers MEDIUMTEXT NOT NULL,
	properties TEXT NOT NULL,
	job_result MEDIUMTEXT,
	result_type VARCHAR(255),
	result_meta MEDIUMTEXT,
	last_error MEDIUMTEXT,
	error_traceback MEDIUMTEXT,
	active_business_key VARCHAR(255) GENERATED ALWAYS AS (CASE WHEN business_key IS NOT NULL AND status IN ('PENDING', 'WAITING', 'RUNNING') AND job_type <> 'RECURRING' THEN business_key END) STORED,
	PRIMARY KEY (id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE INDEX ix_scheduler_job_depends_on ON scheduler_job (depends_on);

CREATE INDEX ix_scheduler_job_finished ON scheduler_job (status, finished_at);

CREATE INDEX ix_scheduler_job_group ON scheduler_job (group_id, status);

CREATE INDEX ix_scheduler_job_owner ON scheduler_job (status, picked_by);

CREATE INDEX ix_scheduler_job_ready_status ON scheduler_job (status, resource, queue, priority DESC, scheduled_time, id);

CREATE UNIQUE INDEX ux_scheduler_job_job_id ON scheduler_job (job_id);

CREATE UNIQUE INDEX ux_scheduler_job_active_key ON scheduler_job (active_business_key);

CREATE TABLE scheduler_job_archive (
	id BIGINT NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	task_name VARCHAR(255) NOT NULL,
	queue VARCHAR(255) NOT NULL,
	status VARCHAR(16) NOT NULL,
	job_type VARCHAR(24) NOT NULL DEFAULT 'SINGLE',
	priority SMALLINT NOT NULL,
	scheduled_time DATETIME(6) NOT NULL,
	created_at DATETIME(6) NOT NULL,
	expires_at DATETIME(6),
	attempts INTEGER NOT NULL DEFAULT '0',
	claims INTEGER NOT NULL DEFAULT '0',
	root_id VARCHAR(255),
	parent_id VARCHAR(255),
	group_id VARCHAR(255),
	depends_on VARCHAR(255),
	business_key VARCHAR(255),
	schedule_spec TEXT,
	resource VARCHAR(255),
	tags TEXT,
	revoke_requested VARCHAR(16),
	picked_by VARCHAR(255),
	claim_token VARCHAR(32),
	claimed_at DATETIME(6),
	started_at DATETIME(6),
	finished_at DATETIME(6),
	payload MEDIUMBLOB NOT NULL,
	content_type VARCHAR(128) NOT NULL,
	content_encoding VARCHAR(64) NOT NULL,
	headers MEDIUMTEXT NOT NULL,
	properties TEXT NOT NULL,
	job_result MEDIUMTEXT,
	result_type VARCHAR(255),
	result_meta MEDIUMTEXT,
	last_error MEDIUMTEXT,
	error_traceback MEDIUMTEXT,
	archived_at DATETIME(6) NOT NULL,
	PRIMARY KEY (id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE INDEX ix_scheduler_job_archive_finished ON scheduler_job_archive (finished_at);

CREATE INDEX ix_scheduler_job_archive_job_id ON scheduler_job_archive (job_id);

CREATE TABLE scheduler_job_log (
	id BIGINT NOT NULL AUTO_INCREMENT,
	job_id VARCHAR(255) NOT NULL,
	logged_at DATETIME(6) NOT NULL,
	level VARCHAR(16) NOT NULL,
	message MEDIUMTEXT NOT NULL,
	PRIMARY KEY (id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE INDEX ix_scheduler_job_log_job ON scheduler_job_log (job_id, id);

CREATE INDEX ix_scheduler_job_log_logged_at ON scheduler_job_log (logged_at);

CREATE TABLE scheduler_node (
	node_id VARCHAR(255) NOT NULL,
	hostname VARCHAR(255) NOT NULL,
	pid INTEGER NOT NULL,
	queues TEXT NOT NULL,
	concurrency INTEGER NOT NULL,
	started_at DATETIME(6) NOT NULL,
	heartbeat_ts DATETIME(6) NOT NULL,
	schedule_keys TEXT,
	task_names MEDIUMTEXT,
	PRIMARY KEY (node_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE scheduler_queue_pause (
	queue VARCHAR(255) NOT NULL,
	paused_at DATETIME(6) NOT NULL,
	reason VARCHAR(255),
	PRIMARY KEY (queue)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE scheduler_resource (
	resource VARCHAR(255) NOT NULL,
	capacity INTEGER NOT NULL,
	updated_at DATETIME(6) NOT NULL,
	PRIMARY KEY (resource)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE scheduler_resource_permit (
	resource VARCHAR(255) NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	node_id VARCHAR(255) NOT NULL,
	acquired_at DATETIME(6) NOT NULL,
	claim_token VARCHAR(32),
	PRIMARY KEY (resource, job_id)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;

CREATE TABLE scheduler_workflow_condition (
	parent_id VARCHAR(255) NOT NULL,
	position INTEGER NOT NULL,
	kind VARCHAR(16) NOT NULL,
	name VARCHAR(255),
	predicate VARCHAR(512),
	waits_for TEXT,
	branch MEDIUMTEXT NOT NULL,
	state VARCHAR(16) NOT NULL,
	decided_at DATETIME(6),
	PRIMARY KEY (parent_id, position)
)ENGINE=InnoDB CHARSET=utf8mb4 COLLATE utf8mb4_bin;
