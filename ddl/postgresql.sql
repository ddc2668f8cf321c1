-- celery_ratchet schema for postgresql. Generated from celery_ratchet/store/schema.py;
-- `ratchet schema show --dialect postgresql` prints it. Do not edit by hand.

CREATE TABLE scheduler_batch (
	batch_id VARCHAR(255) NOT NULL,
	kind VARCHAR(16) NOT NULL,
	name VARCHAR(255),
	state VARCHAR(16) NOT NULL,
	total INTEGER,
	added INTEGER DEFAULT '0' NOT NULL,
	done INTEGER DEFAULT '0' NOT NULL,
	failed INTEGER DEFAULT '0' NOT NULL,
	written INTEGER DEFAULT '0' NOT NULL,
	lease_until TIMESTAMP WITH TIME ZONE,
	progress_written SMALLINT DEFAULT '0' NOT NULL,
	progress_ended SMALLINT DEFAULT '0' NOT NULL,
	on_success TEXT,
	on_failure TEXT,
	on_progress TEXT,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	finished_at TIMESTAMP WITH TIME ZONE,
	PRIMARY KEY (batch_id)
);

CREATE INDEX ix_scheduler_batch_state ON scheduler_batch (state, kind, created_at);

CREATE TABLE scheduler_batch_part (
	batch_id VARCHAR(255) NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	position INTEGER,
	state VARCHAR(16) NOT NULL,
	result TEXT,
	finished_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (batch_id, job_id)
);

CREATE TABLE scheduler_control (
	id BIGSERIAL NOT NULL,
	command VARCHAR(255) NOT NULL,
	arguments TEXT NOT NULL,
	destination TEXT,
	pattern VARCHAR(255),
	matcher VARCHAR(64),
	ticket VARCHAR(64),
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_scheduler_control_expires ON scheduler_control (expires_at);

CREATE TABLE scheduler_control_reply (
	id BIGSERIAL NOT NULL,
	ticket VARCHAR(64) NOT NULL,
	hostname VARCHAR(255) NOT NULL,
	reply TEXT NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_scheduler_control_reply_expires ON scheduler_control_reply (expires_at);

CREATE INDEX ix_scheduler_control_reply_ticket ON scheduler_control_reply (ticket, id);

CREATE TABLE scheduler_dlq_alert (
	task_name VARCHAR(255) NOT NULL,
	opened_at TIMESTAMP WITH TIME ZONE,
	failed INTEGER DEFAULT '0' NOT NULL,
	newest_job_id VARCHAR(255),
	newest_error TEXT,
	newest_at TIMESTAMP WITH TIME ZONE,
	first_opened_at TIMESTAMP WITH TIME ZONE,
	alerts_sent INTEGER DEFAULT '0' NOT NULL,
	last_sent_at TIMESTAMP WITH TIME ZONE,
	last_alert_id VARCHAR(255),
	last_count INTEGER,
	PRIMARY KEY (task_name)
);

CREATE TABLE scheduler_group_result (
	group_id VARCHAR(255) NOT NULL,
	result TEXT NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (group_id)
);

CREATE TABLE scheduler_job (
	id BIGSERIAL NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	task_name VARCHAR(255) NOT NULL,
	queue VARCHAR(255) NOT NULL,
	status VARCHAR(16) NOT NULL,
	job_type VARCHAR(24) DEFAULT 'SINGLE' NOT NULL,
	priority SMALLINT NOT NULL,
	scheduled_time TIMESTAMP WITH TIME ZONE NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE,
	attempts INTEGER DEFAULT '0' NOT NULL,
	claims INTEGER DEFAULT '0' NOT NULL,
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
	claimed_at TIMESTAMP WITH TIME ZONE,
	started_at TIMESTAMP WITH TIME ZONE,
	finished_at TIMESTAMP WITH TIME ZONE,
	payload BYTEA NOT NULL,
	content_type VARCHAR(128) NOT NULL,
	content_encoding VARCHAR(64) NOT NULL,
	headers TEXT NOT NULL,
	properties TEXT NOT NULL,
	job_result TEXT,
	result_type VARCHAR(255),
	result_meta TEXT,
	last_error TEXT,
	error_traceback TEXT,
	PRIMARY KEY (id)
)
 WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);

CREATE INDEX ix_scheduler_job_depends_on ON scheduler_job (depends_on) WHERE depends_on IS NOT NULL;

CREATE INDEX ix_scheduler_job_finished ON scheduler_job (status, finished_at) WHERE finished_at IS NOT NULL;

CREATE INDEX ix_scheduler_job_group ON scheduler_job (group_id, status) WHERE group_id IS NOT NULL;

CREATE INDEX ix_scheduler_job_owner ON scheduler_job (status, picked_by);

CREATE INDEX ix_scheduler_job_ready ON scheduler_job (queue, priority DESC, scheduled_time, id) WHERE status = 'PENDING' AND resource IS NULL;

CREATE INDEX ix_scheduler_job_ready_resource ON scheduler_job (resource, queue, priority DESC, scheduled_time, id) WHERE status = 'PENDING' AND resource IS NOT NULL;

CREATE UNIQUE INDEX ux_scheduler_job_active_key ON scheduler_job (business_key) WHERE business_key IS NOT NULL AND status IN ('PENDING', 'WAITING', 'RUNNING') AND job_type <> 'RECURRING';

CREATE UNIQUE INDEX ux_scheduler_job_job_id ON scheduler_job (job_id);

CREATE TABLE scheduler_job_archive (
	id BIGINT NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	task_name VARCHAR(255) NOT NULL,
	queue VARCHAR(255) NOT NULL,
	status VARCHAR(16) NOT NULL,
	job_type VARCHAR(24) DEFAULT 'SINGLE' NOT NULL,
	priority SMALLINT NOT NULL,
	scheduled_time TIMESTAMP WITH TIME ZONE NOT NULL,
	created_at TIMESTAMP WITH TIME ZONE NOT NULL,
	expires_at TIMESTAMP WITH TIME ZONE,
	attempts INTEGER DEFAULT '0' NOT NULL,
	claims INTEGER DEFAULT '0' NOT NULL,
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
	claimed_at TIMESTAMP WITH TIME ZONE,
	started_at TIMESTAMP WITH TIME ZONE,
	finished_at TIMESTAMP WITH TIME ZONE,
	payload BYTEA NOT NULL,
	content_type VARCHAR(128) NOT NULL,
	content_encoding VARCHAR(64) NOT NULL,
	headers TEXT NOT NULL,
	properties TEXT NOT NULL,
	job_result TEXT,
	result_type VARCHAR(255),
	result_meta TEXT,
	last_error TEXT,
	error_traceback TEXT,
	archived_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_scheduler_job_archive_finished ON scheduler_job_archive (finished_at);

CREATE INDEX ix_scheduler_job_archive_job_id ON scheduler_job_archive (job_id);

CREATE TABLE scheduler_job_log (
	id BIGSERIAL NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	logged_at TIMESTAMP WITH TIME ZONE NOT NULL,
	level VARCHAR(16) NOT NULL,
	message TEXT NOT NULL,
	PRIMARY KEY (id)
);

CREATE INDEX ix_scheduler_job_log_job ON scheduler_job_log (job_id, id);

CREATE INDEX ix_scheduler_job_log_logged_at ON scheduler_job_log (logged_at);

CREATE TABLE scheduler_node (
	node_id VARCHAR(255) NOT NULL,
	hostname VARCHAR(255) NOT NULL,
	pid INTEGER NOT NULL,
	queues TEXT NOT NULL,
	concurrency INTEGER NOT NULL,
	started_at TIMESTAMP WITH TIME ZONE NOT NULL,
	heartbeat_ts TIMESTAMP WITH TIME ZONE NOT NULL,
	schedule_keys TEXT,
	task_names TEXT,
	PRIMARY KEY (node_id)
);

CREATE TABLE scheduler_queue_pause (
	queue VARCHAR(255) NOT NULL,
	paused_at TIMESTAMP WITH TIME ZONE NOT NULL,
	reason VARCHAR(255),
	PRIMARY KEY (queue)
);

CREATE TABLE scheduler_resource (
	resource VARCHAR(255) NOT NULL,
	capacity INTEGER NOT NULL,
	updated_at TIMESTAMP WITH TIME ZONE NOT NULL,
	PRIMARY KEY (resource)
);

CREATE TABLE scheduler_resource_permit (
	resource VARCHAR(255) NOT NULL,
	job_id VARCHAR(255) NOT NULL,
	node_id VARCHAR(255) NOT NULL,
	acquired_at TIMESTAMP WITH TIME ZONE NOT NULL,
	claim_token VARCHAR(32),
	PRIMARY KEY (resource, job_id)
);

CREATE TABLE scheduler_workflow_condition (
	parent_id VARCHAR(255) NOT NULL,
	position INTEGER NOT NULL,
	kind VARCHAR(16) NOT NULL,
	name VARCHAR(255),
	predicate VARCHAR(512),
	waits_for TEXT,
	branch TEXT NOT NULL,
	state VARCHAR(16) NOT NULL,
	decided_at TIMESTAMP WITH TIME ZONE,
	PRIMARY KEY (parent_id, position)
);
