-- plain: install_lock
DECLARE @resource nvarchar(255) = QUOTENAME(DB_NAME()) + N'.' + QUOTENAME(N'dbo') + N'.' + QUOTENAME(N'orders') + N'_lock'; EXEC sp_getapplock @Resource = @resource, @LockMode = N'Exclusive', @LockOwner = N'Transaction';

-- plain: current_catalog
SELECT DB_NAME();

-- plain: create_queue[0]
IF OBJECT_ID(N'[dbo].[orders]', N'U') IS NULL BEGIN CREATE TABLE [dbo].[orders] (Id uniqueidentifier NOT NULL, CorrelationId varchar(255) NULL, ReplyToAddress varchar(255) NULL, Recoverable bit NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [dbo].[orders] (RowVersion); CREATE NONCLUSTERED INDEX [Index_Expires] ON [dbo].[orders] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL; END;

-- plain: add_body_string
IF COL_LENGTH(N'[dbo].[orders]', N'BodyString') IS NULL ALTER TABLE [dbo].[orders] ADD BodyString AS CAST(Body AS nvarchar(max));

-- plain: create_inflight[0]
IF OBJECT_ID(N'[dbo].[sqlqueue_inflight]', N'U') IS NULL BEGIN CREATE TABLE [dbo].[sqlqueue_inflight] (Token uniqueidentifier NOT NULL, Queue nvarchar(450) NOT NULL, Id uniqueidentifier NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Seq bigint NOT NULL, Deliveries int NOT NULL, LeaseUntil datetime2 NOT NULL, LastError nvarchar(max) NULL, Holder nvarchar(400) NULL); CREATE UNIQUE NONCLUSTERED INDEX [Index_Token] ON [dbo].[sqlqueue_inflight] (Token); CREATE NONCLUSTERED INDEX [Index_Lease] ON [dbo].[sqlqueue_inflight] (Queue, LeaseUntil); END;

-- plain: create_inflight[1]
IF COL_LENGTH(N'[dbo].[sqlqueue_inflight]', N'Holder') IS NULL ALTER TABLE [dbo].[sqlqueue_inflight] ADD Holder nvarchar(400) NULL;

-- plain: create_inflight[2]
IF INDEXPROPERTY(OBJECT_ID(N'[dbo].[sqlqueue_inflight]'), N'Index_Holder', 'IndexID') IS NULL CREATE NONCLUSTERED INDEX [Index_Holder] ON [dbo].[sqlqueue_inflight] (Queue, Holder);

-- plain: drop_queue
DROP TABLE IF EXISTS [dbo].[orders];

-- plain: queue_columns
SELECT LOWER(col.name), CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id JOIN sys.tables AS tab ON tab.object_id = col.object_id JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table ORDER BY col.column_id;

-- plain: schema_exists
SELECT CASE WHEN EXISTS (SELECT 1 FROM sys.schemas WHERE name = @p_schema) THEN 1 ELSE 0 END;

-- plain: has_expires_index
SELECT CASE WHEN EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS col ON col.object_id = ic.object_id AND col.column_id = ic.column_id JOIN sys.tables AS tab ON tab.object_id = ic.object_id JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table AND ic.key_ordinal = 1 AND col.name = N'Expires') THEN 1 ELSE 0 END;

-- plain: expires_index_ddl
CREATE NONCLUSTERED INDEX [Index_Expires] ON [dbo].[orders] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL;

-- plain: send
INSERT INTO [dbo].[orders] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- plain: send_legacy
INSERT INTO [dbo].[orders] (Id, Expires, Headers, Body) SELECT v.Id, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- plain: send_batch
INSERT INTO [dbo].[orders] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id1, CAST(@p_ttbr_ms1 AS bigint), @p_headers1, @p_body1), (2, @p_id2, CAST(@p_ttbr_ms2 AS bigint), @p_headers2, @p_body2), (3, @p_id3, CAST(@p_ttbr_ms3 AS bigint), @p_headers3, @p_body3)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- plain: receive
WITH message AS (SELECT TOP (@p_limit) * FROM [dbo].[orders] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, CASE WHEN deleted.Expires IS NOT NULL AND deleted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, deleted.Headers, deleted.Body, deleted.RowVersion;

-- plain: peek
SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK);

-- plain: depth
SELECT COUNT_BIG(*) FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK);

-- plain: purge_expired
WITH expired AS (SELECT TOP (@p_limit) * FROM [dbo].[orders] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Expires < GETUTCDATE()) DELETE FROM expired;

-- plain: purge_all
DELETE FROM [dbo].[orders];

-- plain: insert_error
INSERT INTO [dbo].[error] (Id, Recoverable, Expires, Headers, Body) VALUES (@p_id, 1, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- plain: insert_error_legacy
INSERT INTO [dbo].[error] (Id, Expires, Headers, Body) VALUES (@p_id, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- plain: browse
SELECT TOP (@p_limit) RowVersion, Id, Headers, Body FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after AND RowVersion <= @p_last AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY RowVersion;

-- plain: newest_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [dbo].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion < @p_before ORDER BY RowVersion DESC;

-- plain: find
SELECT n.RowVersion, n.Id, n.Headers FROM (SELECT TOP (@p_scan) RowVersion, Id, Headers FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0 ORDER BY n.RowVersion;

-- plain: scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) RowVersion FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n;

-- plain: find_claims
SELECT n.Queue, n.Seq, n.Id, n.Headers, n.Holder, n.Deliveries FROM (SELECT TOP (@p_scan) Queue, Seq, Id, Headers, Holder, Deliveries FROM [dbo].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0;

-- plain: claims_scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) Token FROM [dbo].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n;

-- plain: can_read
SELECT CAST(COALESCE(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'SELECT'), 0) AS bit);

-- plain: error_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [dbo].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after ORDER BY RowVersion;

-- plain: error_rows
SELECT RowVersion, Id, Headers, Body FROM [dbo].[error] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion;

-- plain: failed_messages
SELECT RowVersion, Id, Headers, DATALENGTH(Body), SUBSTRING(Body, 1, @p_preview) FROM [dbo].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion DESC;

-- plain: list_queues
WITH q AS (SELECT sch.name AS schema_name, tab.name AS table_name FROM sys.tables AS tab JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE tab.name <> N'sqlqueue_inflight' AND (@p_search = N'' OR CHARINDEX(LOWER(@p_search), LOWER(sch.name + N'.' + tab.name)) > 0) AND HAS_PERMS_BY_NAME(QUOTENAME(sch.name) + N'.' + QUOTENAME(tab.name), N'OBJECT', N'SELECT') = 1 AND (SELECT COUNT(*) FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id WHERE col.object_id = tab.object_id AND LOWER(col.name) + N':' + CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END IN (N'id:uniqueidentifier', N'expires:datetime', N'expires:datetime2', N'headers:nvarchar', N'headers:varchar', N'headers:ntext', N'headers:text', N'body:varbinary', N'rowversion:bigint', N'rowversion:int')) = 5) SELECT t.total, p.schema_name, p.table_name FROM (SELECT COUNT(*) AS total FROM q) AS t LEFT JOIN (SELECT schema_name, table_name FROM q ORDER BY schema_name, table_name OFFSET @p_offset ROWS FETCH NEXT @p_limit ROWS ONLY) AS p ON 1 = 1 ORDER BY p.schema_name, p.table_name;

-- plain: queue_figures
DECLARE @limit int = @p_limit; SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT TOP (1) Headers FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion), (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) RowVersion FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK) WHERE Expires < GETUTCDATE()) AS expired), CAST(NULL AS bigint), CAST(NULL AS datetime2);

-- plain: delayed_figures
DECLARE @limit int = @p_limit; SELECT (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) Due FROM [dbo].[orders.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE()) AS due), (SELECT DATEDIFF_BIG(millisecond, MIN(Due), GETUTCDATE()) FROM [dbo].[orders.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE());

-- plain: claim_figures
SELECT COUNT_BIG(*), COUNT_BIG(CASE WHEN LeaseUntil <= SYSUTCDATETIME() THEN 1 END) FROM [dbo].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- plain: claims
SELECT TOP (@p_limit) Id, Holder, Deliveries, DATEDIFF_BIG(millisecond, SYSUTCDATETIME(), LeaseUntil), LastError FROM [dbo].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue ORDER BY LeaseUntil;

-- plain: purge_expired_claims
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH expired AS (SELECT TOP (@limit) * FROM [dbo].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() AND Expires < GETUTCDATE()) DELETE FROM expired;

-- plain: release_lapsed
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [dbo].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [dbo].[orders] (Id, Recoverable, Expires, Headers, Body) SELECT r.Id, 1, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- plain: release_lapsed_legacy
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [dbo].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [dbo].[orders] (Id, Expires, Headers, Body) SELECT r.Id, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- plain: delete_by_seq
DELETE FROM [dbo].[error] WHERE RowVersion = @p_seq;

-- plain: claim
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [dbo].[orders] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [dbo].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, c.Body, c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- plain: reclaim
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [dbo].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- plain: claim_without_bodies
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [dbo].[orders] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [dbo].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, CAST(NULL AS varbinary(max)), c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- plain: reclaim_without_bodies
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [dbo].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, CAST(NULL AS varbinary(max)), inserted.Deliveries, inserted.LastError, inserted.Seq;

-- plain: take
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH taken AS (SELECT * FROM [dbo].[sqlqueue_inflight] WITH (UPDLOCK, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- plain: adopt
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH taken AS (SELECT TOP (@limit) * FROM [dbo].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL ORDER BY Seq) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- plain: peek_with_claims
SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT COUNT_BIG(*) FROM [dbo].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue AND LeaseUntil <= SYSUTCDATETIME());

-- plain: count_inflight
SELECT COUNT_BIG(*) FROM [dbo].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- plain: ack
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [dbo].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token;

-- plain: ack_copy
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [dbo].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token, deleted.Id, deleted.Headers, deleted.Body;

-- plain: nack
DECLARE @delay_ms bigint = @p_delay_ms, @error nvarchar(max) = @p_error, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH given AS (SELECT * FROM [dbo].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE given SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @error OUTPUT inserted.Token;

-- plain: extend
DECLARE @lease_ms bigint = @p_lease_ms, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH held AS (SELECT * FROM [dbo].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE held SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) OUTPUT inserted.Token;

-- plain: held
SELECT Token, Id, Headers, Body, Deliveries, Seq FROM [dbo].[sqlqueue_inflight] WITH (READCOMMITTEDLOCK) WHERE Queue = @p_queue AND Holder = @p_holder AND Seq % @p_parts = @p_part AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY Seq;

-- plain: ack_held
DELETE FROM [dbo].[sqlqueue_inflight] WHERE Queue = @p_queue AND Holder = @p_holder;

-- plain: extend_held
DECLARE @lease_ms bigint = @p_lease_ms; UPDATE [dbo].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) WHERE Queue = @p_queue AND Holder = @p_holder;

-- plain: nack_held
DECLARE @delay_ms bigint = @p_delay_ms; UPDATE [dbo].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @p_error WHERE Queue = @p_queue AND Holder = @p_holder;

-- plain: seq_range
SELECT MIN(RowVersion), MAX(RowVersion) FROM [dbo].[orders] WITH (READPAST, READCOMMITTEDLOCK);

-- plain: create_writes[0]
IF OBJECT_ID(N'[dbo].[sqlqueue_writes]', N'U') IS NULL CREATE TABLE [dbo].[sqlqueue_writes] (WriteId uniqueidentifier NOT NULL, Part int NOT NULL, Recorded datetime2 NOT NULL DEFAULT SYSUTCDATETIME(), PRIMARY KEY (WriteId, Part));

-- plain: record_write
DECLARE @write uniqueidentifier = @p_write, @part int = @p_part; INSERT INTO [dbo].[sqlqueue_writes] (WriteId, Part) SELECT @write, @part WHERE NOT EXISTS (SELECT 1 FROM [dbo].[sqlqueue_writes] WITH (UPDLOCK, HOLDLOCK) WHERE WriteId = @write AND Part = @part);

-- plain: forget_write
DELETE FROM [dbo].[sqlqueue_writes] WHERE WriteId = @p_write;

-- plain: claim_to_error
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [dbo].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [dbo].[error] (Id, Recoverable, Expires, Headers, Body) SELECT m.Id, 1, NULL, @headers, m.Body FROM @moved AS m;

-- plain: claim_to_error_legacy
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [dbo].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [dbo].[error] (Id, Expires, Headers, Body) SELECT m.Id, NULL, @headers, m.Body FROM @moved AS m;

-- plain: create_delayed[0]
IF OBJECT_ID(N'[dbo].[orders.Delayed]', N'U') IS NULL BEGIN CREATE TABLE [dbo].[orders.Delayed] (Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Due datetime NOT NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_Due] ON [dbo].[orders.Delayed] (Due); END;

-- plain: store_delayed
DECLARE @delay_ms bigint = @p_delay_ms; INSERT INTO [dbo].[orders.Delayed] (Headers, Body, Due) VALUES (@p_headers, CAST(@p_body AS varbinary(max)), DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, GETUTCDATE())));

-- plain: due_delayed
SELECT TOP (@p_limit) RowVersion, Headers, Body FROM [dbo].[orders.Delayed] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Due < GETUTCDATE() ORDER BY Due;

-- plain: delete_delayed
DELETE FROM [dbo].[orders.Delayed] WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_keys) AS j);

-- plain: next_due
SELECT DATEDIFF_BIG(millisecond, GETUTCDATE(), min(Due)) FROM [dbo].[orders.Delayed] WITH (READPAST, READCOMMITTEDLOCK);

-- plain: create_subscriptions[0]
IF OBJECT_ID(N'[dbo].[SubscriptionRouting]', N'U') IS NULL CREATE TABLE [dbo].[SubscriptionRouting] (QueueAddress nvarchar(200) NOT NULL, Endpoint nvarchar(200) NOT NULL, Topic nvarchar(200) NOT NULL, PRIMARY KEY (Endpoint, Topic));

-- plain: subscribe
MERGE [dbo].[SubscriptionRouting] WITH (HOLDLOCK, TABLOCK) AS target USING (SELECT CAST(@p_endpoint AS nvarchar(200)) AS Endpoint, CAST(@p_address AS nvarchar(200)) AS QueueAddress, CAST(@p_topic AS nvarchar(200)) AS Topic) AS source ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN UPDATE SET QueueAddress = source.QueueAddress WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) VALUES (source.QueueAddress, source.Topic, source.Endpoint);;

-- plain: unsubscribe
DELETE FROM [dbo].[SubscriptionRouting] WHERE Endpoint = @p_endpoint AND Topic = @p_topic;

-- plain: subscribers
SELECT DISTINCT QueueAddress FROM [dbo].[SubscriptionRouting] WHERE Topic IN (SELECT CAST(j.value AS nvarchar(200)) FROM OPENJSON(@p_topics) AS j) ORDER BY QueueAddress;

-- plain: grant_runtime[0]
GRANT SELECT, INSERT, UPDATE, DELETE ON [dbo].[orders] TO [app]]rt];

-- plain: can_insert
SELECT CAST(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'INSERT') AS bit);

-- escaping: install_lock
DECLARE @resource nvarchar(255) = QUOTENAME(DB_NAME()) + N'.' + QUOTENAME(N'sa]les') + N'.' + QUOTENAME(N'we]ird [name]; DROP TABLE x--''%s') + N'_lock'; EXEC sp_getapplock @Resource = @resource, @LockMode = N'Exclusive', @LockOwner = N'Transaction';

-- escaping: current_catalog
SELECT DB_NAME();

-- escaping: create_queue[0]
IF OBJECT_ID(N'[sa]]les].[we]]ird [name]]; DROP TABLE x--''%s]', N'U') IS NULL BEGIN CREATE TABLE [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Id uniqueidentifier NOT NULL, CorrelationId varchar(255) NULL, ReplyToAddress varchar(255) NULL, Recoverable bit NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (RowVersion); CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL; END;

-- escaping: add_body_string
IF COL_LENGTH(N'[sa]]les].[we]]ird [name]]; DROP TABLE x--''%s]', N'BodyString') IS NULL ALTER TABLE [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] ADD BodyString AS CAST(Body AS nvarchar(max));

-- escaping: create_inflight[0]
IF OBJECT_ID(N'[sa]]les].[sqlqueue_inflight]', N'U') IS NULL BEGIN CREATE TABLE [sa]]les].[sqlqueue_inflight] (Token uniqueidentifier NOT NULL, Queue nvarchar(450) NOT NULL, Id uniqueidentifier NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Seq bigint NOT NULL, Deliveries int NOT NULL, LeaseUntil datetime2 NOT NULL, LastError nvarchar(max) NULL, Holder nvarchar(400) NULL); CREATE UNIQUE NONCLUSTERED INDEX [Index_Token] ON [sa]]les].[sqlqueue_inflight] (Token); CREATE NONCLUSTERED INDEX [Index_Lease] ON [sa]]les].[sqlqueue_inflight] (Queue, LeaseUntil); END;

-- escaping: create_inflight[1]
IF COL_LENGTH(N'[sa]]les].[sqlqueue_inflight]', N'Holder') IS NULL ALTER TABLE [sa]]les].[sqlqueue_inflight] ADD Holder nvarchar(400) NULL;

-- escaping: create_inflight[2]
IF INDEXPROPERTY(OBJECT_ID(N'[sa]]les].[sqlqueue_inflight]'), N'Index_Holder', 'IndexID') IS NULL CREATE NONCLUSTERED INDEX [Index_Holder] ON [sa]]les].[sqlqueue_inflight] (Queue, Holder);

-- escaping: drop_queue
DROP TABLE IF EXISTS [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s];

-- escaping: queue_columns
SELECT LOWER(col.name), CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id JOIN sys.tables AS tab ON tab.object_id = col.object_id JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table ORDER BY col.column_id;

-- escaping: schema_exists
SELECT CASE WHEN EXISTS (SELECT 1 FROM sys.schemas WHERE name = @p_schema) THEN 1 ELSE 0 END;

-- escaping: has_expires_index
SELECT CASE WHEN EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS col ON col.object_id = ic.object_id AND col.column_id = ic.column_id JOIN sys.tables AS tab ON tab.object_id = ic.object_id JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table AND ic.key_ordinal = 1 AND col.name = N'Expires') THEN 1 ELSE 0 END;

-- escaping: expires_index_ddl
CREATE NONCLUSTERED INDEX [Index_Expires] ON [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL;

-- escaping: send
INSERT INTO [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- escaping: send_legacy
INSERT INTO [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Id, Expires, Headers, Body) SELECT v.Id, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- escaping: send_batch
INSERT INTO [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id1, CAST(@p_ttbr_ms1 AS bigint), @p_headers1, @p_body1), (2, @p_id2, CAST(@p_ttbr_ms2 AS bigint), @p_headers2, @p_body2), (3, @p_id3, CAST(@p_ttbr_ms3 AS bigint), @p_headers3, @p_body3)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- escaping: receive
WITH message AS (SELECT TOP (@p_limit) * FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, CASE WHEN deleted.Expires IS NOT NULL AND deleted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, deleted.Headers, deleted.Body, deleted.RowVersion;

-- escaping: peek
SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK);

-- escaping: depth
SELECT COUNT_BIG(*) FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK);

-- escaping: purge_expired
WITH expired AS (SELECT TOP (@p_limit) * FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Expires < GETUTCDATE()) DELETE FROM expired;

-- escaping: purge_all
DELETE FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s];

-- escaping: insert_error
INSERT INTO [sa]]les].[error] (Id, Recoverable, Expires, Headers, Body) VALUES (@p_id, 1, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- escaping: insert_error_legacy
INSERT INTO [sa]]les].[error] (Id, Expires, Headers, Body) VALUES (@p_id, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- escaping: browse
SELECT TOP (@p_limit) RowVersion, Id, Headers, Body FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after AND RowVersion <= @p_last AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY RowVersion;

-- escaping: newest_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [sa]]les].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion < @p_before ORDER BY RowVersion DESC;

-- escaping: find
SELECT n.RowVersion, n.Id, n.Headers FROM (SELECT TOP (@p_scan) RowVersion, Id, Headers FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0 ORDER BY n.RowVersion;

-- escaping: scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) RowVersion FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n;

-- escaping: find_claims
SELECT n.Queue, n.Seq, n.Id, n.Headers, n.Holder, n.Deliveries FROM (SELECT TOP (@p_scan) Queue, Seq, Id, Headers, Holder, Deliveries FROM [sa]]les].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0;

-- escaping: claims_scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) Token FROM [sa]]les].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n;

-- escaping: can_read
SELECT CAST(COALESCE(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'SELECT'), 0) AS bit);

-- escaping: error_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [sa]]les].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after ORDER BY RowVersion;

-- escaping: error_rows
SELECT RowVersion, Id, Headers, Body FROM [sa]]les].[error] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion;

-- escaping: failed_messages
SELECT RowVersion, Id, Headers, DATALENGTH(Body), SUBSTRING(Body, 1, @p_preview) FROM [sa]]les].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion DESC;

-- escaping: list_queues
WITH q AS (SELECT sch.name AS schema_name, tab.name AS table_name FROM sys.tables AS tab JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE tab.name <> N'sqlqueue_inflight' AND (@p_search = N'' OR CHARINDEX(LOWER(@p_search), LOWER(sch.name + N'.' + tab.name)) > 0) AND HAS_PERMS_BY_NAME(QUOTENAME(sch.name) + N'.' + QUOTENAME(tab.name), N'OBJECT', N'SELECT') = 1 AND (SELECT COUNT(*) FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id WHERE col.object_id = tab.object_id AND LOWER(col.name) + N':' + CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END IN (N'id:uniqueidentifier', N'expires:datetime', N'expires:datetime2', N'headers:nvarchar', N'headers:varchar', N'headers:ntext', N'headers:text', N'body:varbinary', N'rowversion:bigint', N'rowversion:int')) = 5) SELECT t.total, p.schema_name, p.table_name FROM (SELECT COUNT(*) AS total FROM q) AS t LEFT JOIN (SELECT schema_name, table_name FROM q ORDER BY schema_name, table_name OFFSET @p_offset ROWS FETCH NEXT @p_limit ROWS ONLY) AS p ON 1 = 1 ORDER BY p.schema_name, p.table_name;

-- escaping: queue_figures
DECLARE @limit int = @p_limit; SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT TOP (1) Headers FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion), (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) RowVersion FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK) WHERE Expires < GETUTCDATE()) AS expired), CAST(NULL AS bigint), CAST(NULL AS datetime2);

-- escaping: delayed_figures
DECLARE @limit int = @p_limit; SELECT (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) Due FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE()) AS due), (SELECT DATEDIFF_BIG(millisecond, MIN(Due), GETUTCDATE()) FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE());

-- escaping: claim_figures
SELECT COUNT_BIG(*), COUNT_BIG(CASE WHEN LeaseUntil <= SYSUTCDATETIME() THEN 1 END) FROM [sa]]les].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- escaping: claims
SELECT TOP (@p_limit) Id, Holder, Deliveries, DATEDIFF_BIG(millisecond, SYSUTCDATETIME(), LeaseUntil), LastError FROM [sa]]les].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue ORDER BY LeaseUntil;

-- escaping: purge_expired_claims
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH expired AS (SELECT TOP (@limit) * FROM [sa]]les].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() AND Expires < GETUTCDATE()) DELETE FROM expired;

-- escaping: release_lapsed
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [sa]]les].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Id, Recoverable, Expires, Headers, Body) SELECT r.Id, 1, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- escaping: release_lapsed_legacy
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [sa]]les].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] (Id, Expires, Headers, Body) SELECT r.Id, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- escaping: delete_by_seq
DELETE FROM [sa]]les].[error] WHERE RowVersion = @p_seq;

-- escaping: claim
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [sa]]les].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, c.Body, c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- escaping: reclaim
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [sa]]les].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- escaping: claim_without_bodies
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [sa]]les].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, CAST(NULL AS varbinary(max)), c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- escaping: reclaim_without_bodies
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [sa]]les].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, CAST(NULL AS varbinary(max)), inserted.Deliveries, inserted.LastError, inserted.Seq;

-- escaping: take
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH taken AS (SELECT * FROM [sa]]les].[sqlqueue_inflight] WITH (UPDLOCK, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- escaping: adopt
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH taken AS (SELECT TOP (@limit) * FROM [sa]]les].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL ORDER BY Seq) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- escaping: peek_with_claims
SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT COUNT_BIG(*) FROM [sa]]les].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue AND LeaseUntil <= SYSUTCDATETIME());

-- escaping: count_inflight
SELECT COUNT_BIG(*) FROM [sa]]les].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- escaping: ack
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [sa]]les].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token;

-- escaping: ack_copy
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [sa]]les].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token, deleted.Id, deleted.Headers, deleted.Body;

-- escaping: nack
DECLARE @delay_ms bigint = @p_delay_ms, @error nvarchar(max) = @p_error, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH given AS (SELECT * FROM [sa]]les].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE given SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @error OUTPUT inserted.Token;

-- escaping: extend
DECLARE @lease_ms bigint = @p_lease_ms, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH held AS (SELECT * FROM [sa]]les].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE held SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) OUTPUT inserted.Token;

-- escaping: held
SELECT Token, Id, Headers, Body, Deliveries, Seq FROM [sa]]les].[sqlqueue_inflight] WITH (READCOMMITTEDLOCK) WHERE Queue = @p_queue AND Holder = @p_holder AND Seq % @p_parts = @p_part AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY Seq;

-- escaping: ack_held
DELETE FROM [sa]]les].[sqlqueue_inflight] WHERE Queue = @p_queue AND Holder = @p_holder;

-- escaping: extend_held
DECLARE @lease_ms bigint = @p_lease_ms; UPDATE [sa]]les].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) WHERE Queue = @p_queue AND Holder = @p_holder;

-- escaping: nack_held
DECLARE @delay_ms bigint = @p_delay_ms; UPDATE [sa]]les].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @p_error WHERE Queue = @p_queue AND Holder = @p_holder;

-- escaping: seq_range
SELECT MIN(RowVersion), MAX(RowVersion) FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] WITH (READPAST, READCOMMITTEDLOCK);

-- escaping: create_writes[0]
IF OBJECT_ID(N'[sa]]les].[sqlqueue_writes]', N'U') IS NULL CREATE TABLE [sa]]les].[sqlqueue_writes] (WriteId uniqueidentifier NOT NULL, Part int NOT NULL, Recorded datetime2 NOT NULL DEFAULT SYSUTCDATETIME(), PRIMARY KEY (WriteId, Part));

-- escaping: record_write
DECLARE @write uniqueidentifier = @p_write, @part int = @p_part; INSERT INTO [sa]]les].[sqlqueue_writes] (WriteId, Part) SELECT @write, @part WHERE NOT EXISTS (SELECT 1 FROM [sa]]les].[sqlqueue_writes] WITH (UPDLOCK, HOLDLOCK) WHERE WriteId = @write AND Part = @part);

-- escaping: forget_write
DELETE FROM [sa]]les].[sqlqueue_writes] WHERE WriteId = @p_write;

-- escaping: claim_to_error
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [sa]]les].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [sa]]les].[error] (Id, Recoverable, Expires, Headers, Body) SELECT m.Id, 1, NULL, @headers, m.Body FROM @moved AS m;

-- escaping: claim_to_error_legacy
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [sa]]les].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [sa]]les].[error] (Id, Expires, Headers, Body) SELECT m.Id, NULL, @headers, m.Body FROM @moved AS m;

-- escaping: create_delayed[0]
IF OBJECT_ID(N'[sa]]les].[we]]ird [name]]; DROP TABLE x--''%s.Delayed]', N'U') IS NULL BEGIN CREATE TABLE [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] (Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Due datetime NOT NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_Due] ON [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] (Due); END;

-- escaping: store_delayed
DECLARE @delay_ms bigint = @p_delay_ms; INSERT INTO [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] (Headers, Body, Due) VALUES (@p_headers, CAST(@p_body AS varbinary(max)), DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, GETUTCDATE())));

-- escaping: due_delayed
SELECT TOP (@p_limit) RowVersion, Headers, Body FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Due < GETUTCDATE() ORDER BY Due;

-- escaping: delete_delayed
DELETE FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_keys) AS j);

-- escaping: next_due
SELECT DATEDIFF_BIG(millisecond, GETUTCDATE(), min(Due)) FROM [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s.Delayed] WITH (READPAST, READCOMMITTEDLOCK);

-- escaping: create_subscriptions[0]
IF OBJECT_ID(N'[sa]]les].[SubscriptionRouting]', N'U') IS NULL CREATE TABLE [sa]]les].[SubscriptionRouting] (QueueAddress nvarchar(200) NOT NULL, Endpoint nvarchar(200) NOT NULL, Topic nvarchar(200) NOT NULL, PRIMARY KEY (Endpoint, Topic));

-- escaping: subscribe
MERGE [sa]]les].[SubscriptionRouting] WITH (HOLDLOCK, TABLOCK) AS target USING (SELECT CAST(@p_endpoint AS nvarchar(200)) AS Endpoint, CAST(@p_address AS nvarchar(200)) AS QueueAddress, CAST(@p_topic AS nvarchar(200)) AS Topic) AS source ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN UPDATE SET QueueAddress = source.QueueAddress WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) VALUES (source.QueueAddress, source.Topic, source.Endpoint);;

-- escaping: unsubscribe
DELETE FROM [sa]]les].[SubscriptionRouting] WHERE Endpoint = @p_endpoint AND Topic = @p_topic;

-- escaping: subscribers
SELECT DISTINCT QueueAddress FROM [sa]]les].[SubscriptionRouting] WHERE Topic IN (SELECT CAST(j.value AS nvarchar(200)) FROM OPENJSON(@p_topics) AS j) ORDER BY QueueAddress;

-- escaping: grant_runtime[0]
GRANT SELECT, INSERT, UPDATE, DELETE ON [sa]]les].[we]]ird [name]]; DROP TABLE x--'%s] TO [app]]rt];

-- escaping: can_insert
SELECT CAST(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'INSERT') AS bit);

-- catalog: install_lock
DECLARE @resource nvarchar(255) = QUOTENAME(N'Shop''s DB') + N'.' + QUOTENAME(N'ops') + N'.' + QUOTENAME(N'Sales.WORKER01') + N'_lock'; EXEC sp_getapplock @Resource = @resource, @LockMode = N'Exclusive', @LockOwner = N'Transaction';

-- catalog: current_catalog
SELECT DB_NAME();

-- catalog: create_queue[0]
IF OBJECT_ID(N'[Shop''s DB].[ops].[Sales.WORKER01]', N'U') IS NULL BEGIN CREATE TABLE [Shop's DB].[ops].[Sales.WORKER01] (Id uniqueidentifier NOT NULL, CorrelationId varchar(255) NULL, ReplyToAddress varchar(255) NULL, Recoverable bit NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [Shop's DB].[ops].[Sales.WORKER01] (RowVersion); CREATE NONCLUSTERED INDEX [Index_Expires] ON [Shop's DB].[ops].[Sales.WORKER01] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL; END;

-- catalog: add_body_string
IF COL_LENGTH(N'[Shop''s DB].[ops].[Sales.WORKER01]', N'BodyString') IS NULL ALTER TABLE [Shop's DB].[ops].[Sales.WORKER01] ADD BodyString AS CAST(Body AS nvarchar(max));

-- catalog: create_inflight[0]
IF OBJECT_ID(N'[Shop''s DB].[ops].[sqlqueue_inflight]', N'U') IS NULL BEGIN CREATE TABLE [Shop's DB].[ops].[sqlqueue_inflight] (Token uniqueidentifier NOT NULL, Queue nvarchar(450) NOT NULL, Id uniqueidentifier NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Seq bigint NOT NULL, Deliveries int NOT NULL, LeaseUntil datetime2 NOT NULL, LastError nvarchar(max) NULL, Holder nvarchar(400) NULL); CREATE UNIQUE NONCLUSTERED INDEX [Index_Token] ON [Shop's DB].[ops].[sqlqueue_inflight] (Token); CREATE NONCLUSTERED INDEX [Index_Lease] ON [Shop's DB].[ops].[sqlqueue_inflight] (Queue, LeaseUntil); END;

-- catalog: create_inflight[1]
IF COL_LENGTH(N'[Shop''s DB].[ops].[sqlqueue_inflight]', N'Holder') IS NULL ALTER TABLE [Shop's DB].[ops].[sqlqueue_inflight] ADD Holder nvarchar(400) NULL;

-- catalog: create_inflight[2]
IF INDEXPROPERTY(OBJECT_ID(N'[Shop''s DB].[ops].[sqlqueue_inflight]'), N'Index_Holder', 'IndexID') IS NULL CREATE NONCLUSTERED INDEX [Index_Holder] ON [Shop's DB].[ops].[sqlqueue_inflight] (Queue, Holder);

-- catalog: drop_queue
DROP TABLE IF EXISTS [Shop's DB].[ops].[Sales.WORKER01];

-- catalog: queue_columns
SELECT LOWER(col.name), CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END FROM [Shop's DB].sys.columns AS col JOIN [Shop's DB].sys.types AS typ ON typ.user_type_id = col.user_type_id JOIN [Shop's DB].sys.tables AS tab ON tab.object_id = col.object_id JOIN [Shop's DB].sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table ORDER BY col.column_id;

-- catalog: schema_exists
SELECT CASE WHEN EXISTS (SELECT 1 FROM [Shop's DB].sys.schemas WHERE name = @p_schema) THEN 1 ELSE 0 END;

-- catalog: has_expires_index
SELECT CASE WHEN EXISTS (SELECT 1 FROM [Shop's DB].sys.index_columns AS ic JOIN [Shop's DB].sys.columns AS col ON col.object_id = ic.object_id AND col.column_id = ic.column_id JOIN [Shop's DB].sys.tables AS tab ON tab.object_id = ic.object_id JOIN [Shop's DB].sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table AND ic.key_ordinal = 1 AND col.name = N'Expires') THEN 1 ELSE 0 END;

-- catalog: expires_index_ddl
CREATE NONCLUSTERED INDEX [Index_Expires] ON [Shop's DB].[ops].[Sales.WORKER01] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL;

-- catalog: send
INSERT INTO [Shop's DB].[ops].[Sales.WORKER01] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- catalog: send_legacy
INSERT INTO [Shop's DB].[ops].[Sales.WORKER01] (Id, Expires, Headers, Body) SELECT v.Id, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- catalog: send_batch
INSERT INTO [Shop's DB].[ops].[Sales.WORKER01] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id1, CAST(@p_ttbr_ms1 AS bigint), @p_headers1, @p_body1), (2, @p_id2, CAST(@p_ttbr_ms2 AS bigint), @p_headers2, @p_body2), (3, @p_id3, CAST(@p_ttbr_ms3 AS bigint), @p_headers3, @p_body3)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- catalog: receive
WITH message AS (SELECT TOP (@p_limit) * FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, CASE WHEN deleted.Expires IS NOT NULL AND deleted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, deleted.Headers, deleted.Body, deleted.RowVersion;

-- catalog: peek
SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK);

-- catalog: depth
SELECT COUNT_BIG(*) FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK);

-- catalog: purge_expired
WITH expired AS (SELECT TOP (@p_limit) * FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Expires < GETUTCDATE()) DELETE FROM expired;

-- catalog: purge_all
DELETE FROM [Shop's DB].[ops].[Sales.WORKER01];

-- catalog: insert_error
INSERT INTO [Shop's DB].[ops].[error] (Id, Recoverable, Expires, Headers, Body) VALUES (@p_id, 1, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- catalog: insert_error_legacy
INSERT INTO [Shop's DB].[ops].[error] (Id, Expires, Headers, Body) VALUES (@p_id, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- catalog: browse
SELECT TOP (@p_limit) RowVersion, Id, Headers, Body FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after AND RowVersion <= @p_last AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY RowVersion;

-- catalog: newest_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [Shop's DB].[ops].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion < @p_before ORDER BY RowVersion DESC;

-- catalog: find
SELECT n.RowVersion, n.Id, n.Headers FROM (SELECT TOP (@p_scan) RowVersion, Id, Headers FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0 ORDER BY n.RowVersion;

-- catalog: scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) RowVersion FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n;

-- catalog: find_claims
SELECT n.Queue, n.Seq, n.Id, n.Headers, n.Holder, n.Deliveries FROM (SELECT TOP (@p_scan) Queue, Seq, Id, Headers, Holder, Deliveries FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0;

-- catalog: claims_scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) Token FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n;

-- catalog: can_read
SELECT CAST(COALESCE(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'SELECT'), 0) AS bit);

-- catalog: error_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [Shop's DB].[ops].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after ORDER BY RowVersion;

-- catalog: error_rows
SELECT RowVersion, Id, Headers, Body FROM [Shop's DB].[ops].[error] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion;

-- catalog: failed_messages
SELECT RowVersion, Id, Headers, DATALENGTH(Body), SUBSTRING(Body, 1, @p_preview) FROM [Shop's DB].[ops].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion DESC;

-- catalog: list_queues
WITH q AS (SELECT sch.name AS schema_name, tab.name AS table_name FROM sys.tables AS tab JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE tab.name <> N'sqlqueue_inflight' AND (@p_search = N'' OR CHARINDEX(LOWER(@p_search), LOWER(sch.name + N'.' + tab.name)) > 0) AND HAS_PERMS_BY_NAME(QUOTENAME(sch.name) + N'.' + QUOTENAME(tab.name), N'OBJECT', N'SELECT') = 1 AND (SELECT COUNT(*) FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id WHERE col.object_id = tab.object_id AND LOWER(col.name) + N':' + CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END IN (N'id:uniqueidentifier', N'expires:datetime', N'expires:datetime2', N'headers:nvarchar', N'headers:varchar', N'headers:ntext', N'headers:text', N'body:varbinary', N'rowversion:bigint', N'rowversion:int')) = 5) SELECT t.total, p.schema_name, p.table_name FROM (SELECT COUNT(*) AS total FROM q) AS t LEFT JOIN (SELECT schema_name, table_name FROM q ORDER BY schema_name, table_name OFFSET @p_offset ROWS FETCH NEXT @p_limit ROWS ONLY) AS p ON 1 = 1 ORDER BY p.schema_name, p.table_name;

-- catalog: queue_figures
DECLARE @limit int = @p_limit; SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT TOP (1) Headers FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion), (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) RowVersion FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK) WHERE Expires < GETUTCDATE()) AS expired), CAST(NULL AS bigint), CAST(NULL AS datetime2);

-- catalog: delayed_figures
DECLARE @limit int = @p_limit; SELECT (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) Due FROM [Shop's DB].[ops].[Sales.WORKER01.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE()) AS due), (SELECT DATEDIFF_BIG(millisecond, MIN(Due), GETUTCDATE()) FROM [Shop's DB].[ops].[Sales.WORKER01.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE());

-- catalog: claim_figures
SELECT COUNT_BIG(*), COUNT_BIG(CASE WHEN LeaseUntil <= SYSUTCDATETIME() THEN 1 END) FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- catalog: claims
SELECT TOP (@p_limit) Id, Holder, Deliveries, DATEDIFF_BIG(millisecond, SYSUTCDATETIME(), LeaseUntil), LastError FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue ORDER BY LeaseUntil;

-- catalog: purge_expired_claims
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH expired AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() AND Expires < GETUTCDATE()) DELETE FROM expired;

-- catalog: release_lapsed
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [Shop's DB].[ops].[Sales.WORKER01] (Id, Recoverable, Expires, Headers, Body) SELECT r.Id, 1, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- catalog: release_lapsed_legacy
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [Shop's DB].[ops].[Sales.WORKER01] (Id, Expires, Headers, Body) SELECT r.Id, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- catalog: delete_by_seq
DELETE FROM [Shop's DB].[ops].[error] WHERE RowVersion = @p_seq;

-- catalog: claim
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [Shop's DB].[ops].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, c.Body, c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- catalog: reclaim
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- catalog: claim_without_bodies
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [Shop's DB].[ops].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, CAST(NULL AS varbinary(max)), c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- catalog: reclaim_without_bodies
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, CAST(NULL AS varbinary(max)), inserted.Deliveries, inserted.LastError, inserted.Seq;

-- catalog: take
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH taken AS (SELECT * FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (UPDLOCK, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- catalog: adopt
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH taken AS (SELECT TOP (@limit) * FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL ORDER BY Seq) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- catalog: peek_with_claims
SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT COUNT_BIG(*) FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue AND LeaseUntil <= SYSUTCDATETIME());

-- catalog: count_inflight
SELECT COUNT_BIG(*) FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- catalog: ack
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [Shop's DB].[ops].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token;

-- catalog: ack_copy
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [Shop's DB].[ops].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token, deleted.Id, deleted.Headers, deleted.Body;

-- catalog: nack
DECLARE @delay_ms bigint = @p_delay_ms, @error nvarchar(max) = @p_error, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH given AS (SELECT * FROM [Shop's DB].[ops].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE given SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @error OUTPUT inserted.Token;

-- catalog: extend
DECLARE @lease_ms bigint = @p_lease_ms, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH held AS (SELECT * FROM [Shop's DB].[ops].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE held SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) OUTPUT inserted.Token;

-- catalog: held
SELECT Token, Id, Headers, Body, Deliveries, Seq FROM [Shop's DB].[ops].[sqlqueue_inflight] WITH (READCOMMITTEDLOCK) WHERE Queue = @p_queue AND Holder = @p_holder AND Seq % @p_parts = @p_part AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY Seq;

-- catalog: ack_held
DELETE FROM [Shop's DB].[ops].[sqlqueue_inflight] WHERE Queue = @p_queue AND Holder = @p_holder;

-- catalog: extend_held
DECLARE @lease_ms bigint = @p_lease_ms; UPDATE [Shop's DB].[ops].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) WHERE Queue = @p_queue AND Holder = @p_holder;

-- catalog: nack_held
DECLARE @delay_ms bigint = @p_delay_ms; UPDATE [Shop's DB].[ops].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @p_error WHERE Queue = @p_queue AND Holder = @p_holder;

-- catalog: seq_range
SELECT MIN(RowVersion), MAX(RowVersion) FROM [Shop's DB].[ops].[Sales.WORKER01] WITH (READPAST, READCOMMITTEDLOCK);

-- catalog: create_writes[0]
IF OBJECT_ID(N'[Shop''s DB].[ops].[sqlqueue_writes]', N'U') IS NULL CREATE TABLE [Shop's DB].[ops].[sqlqueue_writes] (WriteId uniqueidentifier NOT NULL, Part int NOT NULL, Recorded datetime2 NOT NULL DEFAULT SYSUTCDATETIME(), PRIMARY KEY (WriteId, Part));

-- catalog: record_write
DECLARE @write uniqueidentifier = @p_write, @part int = @p_part; INSERT INTO [Shop's DB].[ops].[sqlqueue_writes] (WriteId, Part) SELECT @write, @part WHERE NOT EXISTS (SELECT 1 FROM [Shop's DB].[ops].[sqlqueue_writes] WITH (UPDLOCK, HOLDLOCK) WHERE WriteId = @write AND Part = @part);

-- catalog: forget_write
DELETE FROM [Shop's DB].[ops].[sqlqueue_writes] WHERE WriteId = @p_write;

-- catalog: claim_to_error
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [Shop's DB].[ops].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [Shop's DB].[ops].[error] (Id, Recoverable, Expires, Headers, Body) SELECT m.Id, 1, NULL, @headers, m.Body FROM @moved AS m;

-- catalog: claim_to_error_legacy
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [Shop's DB].[ops].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [Shop's DB].[ops].[error] (Id, Expires, Headers, Body) SELECT m.Id, NULL, @headers, m.Body FROM @moved AS m;

-- catalog: create_delayed[0]
IF OBJECT_ID(N'[Shop''s DB].[ops].[Sales.WORKER01.Delayed]', N'U') IS NULL BEGIN CREATE TABLE [Shop's DB].[ops].[Sales.WORKER01.Delayed] (Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Due datetime NOT NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_Due] ON [Shop's DB].[ops].[Sales.WORKER01.Delayed] (Due); END;

-- catalog: store_delayed
DECLARE @delay_ms bigint = @p_delay_ms; INSERT INTO [Shop's DB].[ops].[Sales.WORKER01.Delayed] (Headers, Body, Due) VALUES (@p_headers, CAST(@p_body AS varbinary(max)), DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, GETUTCDATE())));

-- catalog: due_delayed
SELECT TOP (@p_limit) RowVersion, Headers, Body FROM [Shop's DB].[ops].[Sales.WORKER01.Delayed] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Due < GETUTCDATE() ORDER BY Due;

-- catalog: delete_delayed
DELETE FROM [Shop's DB].[ops].[Sales.WORKER01.Delayed] WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_keys) AS j);

-- catalog: next_due
SELECT DATEDIFF_BIG(millisecond, GETUTCDATE(), min(Due)) FROM [Shop's DB].[ops].[Sales.WORKER01.Delayed] WITH (READPAST, READCOMMITTEDLOCK);

-- catalog: create_subscriptions[0]
IF OBJECT_ID(N'[Shop''s DB].[ops].[SubscriptionRouting]', N'U') IS NULL CREATE TABLE [Shop's DB].[ops].[SubscriptionRouting] (QueueAddress nvarchar(200) NOT NULL, Endpoint nvarchar(200) NOT NULL, Topic nvarchar(200) NOT NULL, PRIMARY KEY (Endpoint, Topic));

-- catalog: subscribe
MERGE [Shop's DB].[ops].[SubscriptionRouting] WITH (HOLDLOCK, TABLOCK) AS target USING (SELECT CAST(@p_endpoint AS nvarchar(200)) AS Endpoint, CAST(@p_address AS nvarchar(200)) AS QueueAddress, CAST(@p_topic AS nvarchar(200)) AS Topic) AS source ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN UPDATE SET QueueAddress = source.QueueAddress WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) VALUES (source.QueueAddress, source.Topic, source.Endpoint);;

-- catalog: unsubscribe
DELETE FROM [Shop's DB].[ops].[SubscriptionRouting] WHERE Endpoint = @p_endpoint AND Topic = @p_topic;

-- catalog: subscribers
SELECT DISTINCT QueueAddress FROM [Shop's DB].[ops].[SubscriptionRouting] WHERE Topic IN (SELECT CAST(j.value AS nvarchar(200)) FROM OPENJSON(@p_topics) AS j) ORDER BY QueueAddress;

-- catalog: grant_runtime[0]
USE [Shop's DB]; GRANT SELECT, INSERT, UPDATE, DELETE ON [ops].[Sales.WORKER01] TO [app]]rt];

-- catalog: can_insert
SELECT CAST(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'INSERT') AS bit);

-- unicode: install_lock
DECLARE @resource nvarchar(255) = QUOTENAME(DB_NAME()) + N'.' + QUOTENAME(N'ünï') + N'.' + QUOTENAME(N'東京 queue') + N'_lock'; EXEC sp_getapplock @Resource = @resource, @LockMode = N'Exclusive', @LockOwner = N'Transaction';

-- unicode: current_catalog
SELECT DB_NAME();

-- unicode: create_queue[0]
IF OBJECT_ID(N'[ünï].[東京 queue]', N'U') IS NULL BEGIN CREATE TABLE [ünï].[東京 queue] (Id uniqueidentifier NOT NULL, CorrelationId varchar(255) NULL, ReplyToAddress varchar(255) NULL, Recoverable bit NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_RowVersion] ON [ünï].[東京 queue] (RowVersion); CREATE NONCLUSTERED INDEX [Index_Expires] ON [ünï].[東京 queue] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL; END;

-- unicode: add_body_string
IF COL_LENGTH(N'[ünï].[東京 queue]', N'BodyString') IS NULL ALTER TABLE [ünï].[東京 queue] ADD BodyString AS CAST(Body AS nvarchar(max));

-- unicode: create_inflight[0]
IF OBJECT_ID(N'[ünï].[sqlqueue_inflight]', N'U') IS NULL BEGIN CREATE TABLE [ünï].[sqlqueue_inflight] (Token uniqueidentifier NOT NULL, Queue nvarchar(450) NOT NULL, Id uniqueidentifier NOT NULL, Expires datetime NULL, Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Seq bigint NOT NULL, Deliveries int NOT NULL, LeaseUntil datetime2 NOT NULL, LastError nvarchar(max) NULL, Holder nvarchar(400) NULL); CREATE UNIQUE NONCLUSTERED INDEX [Index_Token] ON [ünï].[sqlqueue_inflight] (Token); CREATE NONCLUSTERED INDEX [Index_Lease] ON [ünï].[sqlqueue_inflight] (Queue, LeaseUntil); END;

-- unicode: create_inflight[1]
IF COL_LENGTH(N'[ünï].[sqlqueue_inflight]', N'Holder') IS NULL ALTER TABLE [ünï].[sqlqueue_inflight] ADD Holder nvarchar(400) NULL;

-- unicode: create_inflight[2]
IF INDEXPROPERTY(OBJECT_ID(N'[ünï].[sqlqueue_inflight]'), N'Index_Holder', 'IndexID') IS NULL CREATE NONCLUSTERED INDEX [Index_Holder] ON [ünï].[sqlqueue_inflight] (Queue, Holder);

-- unicode: drop_queue
DROP TABLE IF EXISTS [ünï].[東京 queue];

-- unicode: queue_columns
SELECT LOWER(col.name), CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id JOIN sys.tables AS tab ON tab.object_id = col.object_id JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table ORDER BY col.column_id;

-- unicode: schema_exists
SELECT CASE WHEN EXISTS (SELECT 1 FROM sys.schemas WHERE name = @p_schema) THEN 1 ELSE 0 END;

-- unicode: has_expires_index
SELECT CASE WHEN EXISTS (SELECT 1 FROM sys.index_columns AS ic JOIN sys.columns AS col ON col.object_id = ic.object_id AND col.column_id = ic.column_id JOIN sys.tables AS tab ON tab.object_id = ic.object_id JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE sch.name = @p_schema AND tab.name = @p_table AND ic.key_ordinal = 1 AND col.name = N'Expires') THEN 1 ELSE 0 END;

-- unicode: expires_index_ddl
CREATE NONCLUSTERED INDEX [Index_Expires] ON [ünï].[東京 queue] (Expires) INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL;

-- unicode: send
INSERT INTO [ünï].[東京 queue] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- unicode: send_legacy
INSERT INTO [ünï].[東京 queue] (Id, Expires, Headers, Body) SELECT v.Id, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id, CAST(@p_ttbr_ms AS bigint), @p_headers, @p_body)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- unicode: send_batch
INSERT INTO [ünï].[東京 queue] (Id, Recoverable, Expires, Headers, Body) SELECT v.Id, 1, DATEADD(millisecond, v.Ttbr % 86400000, DATEADD(day, v.Ttbr / 86400000, GETUTCDATE())), v.Headers, v.Body FROM (VALUES (1, @p_id1, CAST(@p_ttbr_ms1 AS bigint), @p_headers1, @p_body1), (2, @p_id2, CAST(@p_ttbr_ms2 AS bigint), @p_headers2, @p_body2), (3, @p_id3, CAST(@p_ttbr_ms3 AS bigint), @p_headers3, @p_body3)) AS v(Ord, Id, Ttbr, Headers, Body) ORDER BY v.Ord;

-- unicode: receive
WITH message AS (SELECT TOP (@p_limit) * FROM [ünï].[東京 queue] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, CASE WHEN deleted.Expires IS NOT NULL AND deleted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, deleted.Headers, deleted.Body, deleted.RowVersion;

-- unicode: peek
SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK);

-- unicode: depth
SELECT COUNT_BIG(*) FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK);

-- unicode: purge_expired
WITH expired AS (SELECT TOP (@p_limit) * FROM [ünï].[東京 queue] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Expires < GETUTCDATE()) DELETE FROM expired;

-- unicode: purge_all
DELETE FROM [ünï].[東京 queue];

-- unicode: insert_error
INSERT INTO [ünï].[error] (Id, Recoverable, Expires, Headers, Body) VALUES (@p_id, 1, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- unicode: insert_error_legacy
INSERT INTO [ünï].[error] (Id, Expires, Headers, Body) VALUES (@p_id, NULL, @p_headers, CAST(@p_body AS varbinary(max)));

-- unicode: browse
SELECT TOP (@p_limit) RowVersion, Id, Headers, Body FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after AND RowVersion <= @p_last AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY RowVersion;

-- unicode: newest_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [ünï].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion < @p_before ORDER BY RowVersion DESC;

-- unicode: find
SELECT n.RowVersion, n.Id, n.Headers FROM (SELECT TOP (@p_scan) RowVersion, Id, Headers FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0 ORDER BY n.RowVersion;

-- unicode: scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) RowVersion FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion DESC) AS n;

-- unicode: find_claims
SELECT n.Queue, n.Seq, n.Id, n.Headers, n.Holder, n.Deliveries FROM (SELECT TOP (@p_scan) Queue, Seq, Id, Headers, Holder, Deliveries FROM [ünï].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n WHERE CHARINDEX(@p_needle, LOWER(n.Headers)) > 0;

-- unicode: claims_scanned_all
SELECT CAST(CASE WHEN COUNT(*) <= @p_scan THEN 1 ELSE 0 END AS bit) FROM (SELECT TOP (@p_scan + 1) Token FROM [ünï].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK)) AS n;

-- unicode: can_read
SELECT CAST(COALESCE(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'SELECT'), 0) AS bit);

-- unicode: error_headers
SELECT TOP (@p_limit) RowVersion, Headers FROM [ünï].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion > @p_after ORDER BY RowVersion;

-- unicode: error_rows
SELECT RowVersion, Id, Headers, Body FROM [ünï].[error] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion;

-- unicode: failed_messages
SELECT RowVersion, Id, Headers, DATALENGTH(Body), SUBSTRING(Body, 1, @p_preview) FROM [ünï].[error] WITH (READPAST, READCOMMITTEDLOCK) WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_seqs) AS j) ORDER BY RowVersion DESC;

-- unicode: list_queues
WITH q AS (SELECT sch.name AS schema_name, tab.name AS table_name FROM sys.tables AS tab JOIN sys.schemas AS sch ON sch.schema_id = tab.schema_id WHERE tab.name <> N'sqlqueue_inflight' AND (@p_search = N'' OR CHARINDEX(LOWER(@p_search), LOWER(sch.name + N'.' + tab.name)) > 0) AND HAS_PERMS_BY_NAME(QUOTENAME(sch.name) + N'.' + QUOTENAME(tab.name), N'OBJECT', N'SELECT') = 1 AND (SELECT COUNT(*) FROM sys.columns AS col JOIN sys.types AS typ ON typ.user_type_id = col.user_type_id WHERE col.object_id = tab.object_id AND LOWER(col.name) + N':' + CASE WHEN LOWER(col.name) = N'rowversion' AND col.is_identity = 0 THEN typ.name + N' without identity' ELSE typ.name END IN (N'id:uniqueidentifier', N'expires:datetime', N'expires:datetime2', N'headers:nvarchar', N'headers:varchar', N'headers:ntext', N'headers:text', N'body:varbinary', N'rowversion:bigint', N'rowversion:int')) = 5) SELECT t.total, p.schema_name, p.table_name FROM (SELECT COUNT(*) AS total FROM q) AS t LEFT JOIN (SELECT schema_name, table_name FROM q ORDER BY schema_name, table_name OFFSET @p_offset ROWS FETCH NEXT @p_limit ROWS ONLY) AS p ON 1 = 1 ORDER BY p.schema_name, p.table_name;

-- unicode: queue_figures
DECLARE @limit int = @p_limit; SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT TOP (1) Headers FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK) ORDER BY RowVersion), (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) RowVersion FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK) WHERE Expires < GETUTCDATE()) AS expired), CAST(NULL AS bigint), CAST(NULL AS datetime2);

-- unicode: delayed_figures
DECLARE @limit int = @p_limit; SELECT (SELECT COUNT_BIG(*) FROM (SELECT TOP (@limit) Due FROM [ünï].[東京 queue.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE()) AS due), (SELECT DATEDIFF_BIG(millisecond, MIN(Due), GETUTCDATE()) FROM [ünï].[東京 queue.Delayed] WITH (READPAST, READCOMMITTEDLOCK) WHERE Due < GETUTCDATE());

-- unicode: claim_figures
SELECT COUNT_BIG(*), COUNT_BIG(CASE WHEN LeaseUntil <= SYSUTCDATETIME() THEN 1 END) FROM [ünï].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- unicode: claims
SELECT TOP (@p_limit) Id, Holder, Deliveries, DATEDIFF_BIG(millisecond, SYSUTCDATETIME(), LeaseUntil), LastError FROM [ünï].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue ORDER BY LeaseUntil;

-- unicode: purge_expired_claims
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH expired AS (SELECT TOP (@limit) * FROM [ünï].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() AND Expires < GETUTCDATE()) DELETE FROM expired;

-- unicode: release_lapsed
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [ünï].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [ünï].[東京 queue] (Id, Recoverable, Expires, Headers, Body) SELECT r.Id, 1, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- unicode: release_lapsed_legacy
DECLARE @queue nvarchar(450) = @p_queue, @limit int = @p_limit; DECLARE @released TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); WITH lapsed AS (SELECT TOP (@limit) * FROM [ünï].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) DELETE FROM lapsed OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.Seq INTO @released; INSERT INTO [ünï].[東京 queue] (Id, Expires, Headers, Body) SELECT r.Id, r.Expires, r.Headers, r.Body FROM @released AS r ORDER BY r.Seq; SELECT r.Id FROM @released AS r ORDER BY r.Seq;

-- unicode: delete_by_seq
DELETE FROM [ünï].[error] WHERE RowVersion = @p_seq;

-- unicode: claim
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [ünï].[東京 queue] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [ünï].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, c.Body, c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- unicode: reclaim
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [ünï].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- unicode: claim_without_bodies
DECLARE @limit int = @p_limit, @queue nvarchar(450) = @p_queue, @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @now datetime = GETUTCDATE(); DECLARE @taken TABLE (Id uniqueidentifier, Expires datetime, Headers nvarchar(max), Body varbinary(max), Seq bigint); DECLARE @claimed TABLE (Token uniqueidentifier, Id uniqueidentifier, Headers nvarchar(max), Body varbinary(max), Deliveries int, Seq bigint); WITH message AS (SELECT TOP (@limit) * FROM [ünï].[東京 queue] WITH (UPDLOCK, READPAST, ROWLOCK) ORDER BY RowVersion) DELETE FROM message OUTPUT deleted.Id, deleted.Expires, deleted.Headers, deleted.Body, deleted.RowVersion INTO @taken; INSERT INTO [ünï].[sqlqueue_inflight] (Token, Queue, Id, Expires, Headers, Body, Seq, Deliveries, LeaseUntil, Holder) OUTPUT inserted.Token, inserted.Id, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.Seq INTO @claimed SELECT NEWID(), @queue, t.Id, t.Expires, COALESCE(t.Headers, N'null'), t.Body, t.Seq, @deliveries, DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), @holder FROM @taken AS t WHERE t.Expires IS NULL OR t.Expires > @now; SELECT c.Token, c.Id, c.Headers, CAST(NULL AS varbinary(max)), c.Deliveries, c.Seq FROM @claimed AS c UNION ALL SELECT NULL, t.Id, NULL, NULL, 0, t.Seq FROM @taken AS t WHERE t.Expires IS NOT NULL AND t.Expires <= @now;

-- unicode: reclaim_without_bodies
DECLARE @deliveries int = @p_deliveries, @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH lapsed AS (SELECT TOP (@limit) * FROM [ünï].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND LeaseUntil <= SYSUTCDATETIME() ORDER BY Seq) UPDATE lapsed SET Token = NEWID(), Deliveries = Deliveries + @deliveries, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, CAST(NULL AS varbinary(max)), inserted.Deliveries, inserted.LastError, inserted.Seq;

-- unicode: take
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH taken AS (SELECT * FROM [ünï].[sqlqueue_inflight] WITH (UPDLOCK, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- unicode: adopt
DECLARE @lease_ms bigint = @p_lease_ms, @holder nvarchar(400) = @p_holder, @queue nvarchar(450) = @p_queue, @limit int = @p_limit; WITH taken AS (SELECT TOP (@limit) * FROM [ünï].[sqlqueue_inflight] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Queue = @queue AND Holder IS NULL ORDER BY Seq) UPDATE taken SET Token = NEWID(), Deliveries = Deliveries + 1, LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())), Holder = @holder OUTPUT inserted.Token, inserted.Id, CASE WHEN inserted.Expires IS NOT NULL AND inserted.Expires <= GETUTCDATE() THEN 1 ELSE 0 END, inserted.Headers, inserted.Body, inserted.Deliveries, inserted.LastError, inserted.Seq;

-- unicode: peek_with_claims
SELECT (SELECT ISNULL(MAX(RowVersion) - MIN(RowVersion) + 1, 0) FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK)), (SELECT COUNT_BIG(*) FROM [ünï].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue AND LeaseUntil <= SYSUTCDATETIME());

-- unicode: count_inflight
SELECT COUNT_BIG(*) FROM [ünï].[sqlqueue_inflight] WITH (READPAST, READCOMMITTEDLOCK) WHERE Queue = @p_queue;

-- unicode: ack
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [ünï].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token;

-- unicode: ack_copy
DECLARE @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH settled AS (SELECT * FROM [ünï].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) DELETE FROM settled OUTPUT deleted.Token, deleted.Id, deleted.Headers, deleted.Body;

-- unicode: nack
DECLARE @delay_ms bigint = @p_delay_ms, @error nvarchar(max) = @p_error, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH given AS (SELECT * FROM [ünï].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE given SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @error OUTPUT inserted.Token;

-- unicode: extend
DECLARE @lease_ms bigint = @p_lease_ms, @tokens nvarchar(max) = @p_tokens, @queue nvarchar(450) = @p_queue; WITH held AS (SELECT * FROM [ünï].[sqlqueue_inflight] WHERE Queue = @queue AND Token IN (SELECT CONVERT(uniqueidentifier, j.value) FROM OPENJSON(@tokens) AS j)) UPDATE held SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) OUTPUT inserted.Token;

-- unicode: held
SELECT Token, Id, Headers, Body, Deliveries, Seq FROM [ünï].[sqlqueue_inflight] WITH (READCOMMITTEDLOCK) WHERE Queue = @p_queue AND Holder = @p_holder AND Seq % @p_parts = @p_part AND (Expires IS NULL OR Expires > GETUTCDATE()) ORDER BY Seq;

-- unicode: ack_held
DELETE FROM [ünï].[sqlqueue_inflight] WHERE Queue = @p_queue AND Holder = @p_holder;

-- unicode: extend_held
DECLARE @lease_ms bigint = @p_lease_ms; UPDATE [ünï].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @lease_ms % 86400000, DATEADD(day, @lease_ms / 86400000, SYSUTCDATETIME())) WHERE Queue = @p_queue AND Holder = @p_holder;

-- unicode: nack_held
DECLARE @delay_ms bigint = @p_delay_ms; UPDATE [ünï].[sqlqueue_inflight] SET LeaseUntil = DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, SYSUTCDATETIME())), LastError = @p_error WHERE Queue = @p_queue AND Holder = @p_holder;

-- unicode: seq_range
SELECT MIN(RowVersion), MAX(RowVersion) FROM [ünï].[東京 queue] WITH (READPAST, READCOMMITTEDLOCK);

-- unicode: create_writes[0]
IF OBJECT_ID(N'[ünï].[sqlqueue_writes]', N'U') IS NULL CREATE TABLE [ünï].[sqlqueue_writes] (WriteId uniqueidentifier NOT NULL, Part int NOT NULL, Recorded datetime2 NOT NULL DEFAULT SYSUTCDATETIME(), PRIMARY KEY (WriteId, Part));

-- unicode: record_write
DECLARE @write uniqueidentifier = @p_write, @part int = @p_part; INSERT INTO [ünï].[sqlqueue_writes] (WriteId, Part) SELECT @write, @part WHERE NOT EXISTS (SELECT 1 FROM [ünï].[sqlqueue_writes] WITH (UPDLOCK, HOLDLOCK) WHERE WriteId = @write AND Part = @part);

-- unicode: forget_write
DELETE FROM [ünï].[sqlqueue_writes] WHERE WriteId = @p_write;

-- unicode: claim_to_error
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [ünï].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [ünï].[error] (Id, Recoverable, Expires, Headers, Body) SELECT m.Id, 1, NULL, @headers, m.Body FROM @moved AS m;

-- unicode: claim_to_error_legacy
DECLARE @token uniqueidentifier = @p_token, @queue nvarchar(450) = @p_queue, @headers nvarchar(max) = @p_headers; DECLARE @moved TABLE (Id uniqueidentifier, Body varbinary(max)); WITH claimed AS (SELECT * FROM [ünï].[sqlqueue_inflight] WHERE Token = @token AND Queue = @queue) DELETE FROM claimed OUTPUT deleted.Id, deleted.Body INTO @moved; INSERT INTO [ünï].[error] (Id, Expires, Headers, Body) SELECT m.Id, NULL, @headers, m.Body FROM @moved AS m;

-- unicode: create_delayed[0]
IF OBJECT_ID(N'[ünï].[東京 queue.Delayed]', N'U') IS NULL BEGIN CREATE TABLE [ünï].[東京 queue.Delayed] (Headers nvarchar(max) NOT NULL, Body varbinary(max) NULL, Due datetime NOT NULL, RowVersion bigint IDENTITY(1,1) NOT NULL); CREATE NONCLUSTERED INDEX [Index_Due] ON [ünï].[東京 queue.Delayed] (Due); END;

-- unicode: store_delayed
DECLARE @delay_ms bigint = @p_delay_ms; INSERT INTO [ünï].[東京 queue.Delayed] (Headers, Body, Due) VALUES (@p_headers, CAST(@p_body AS varbinary(max)), DATEADD(millisecond, @delay_ms % 86400000, DATEADD(day, @delay_ms / 86400000, GETUTCDATE())));

-- unicode: due_delayed
SELECT TOP (@p_limit) RowVersion, Headers, Body FROM [ünï].[東京 queue.Delayed] WITH (UPDLOCK, READPAST, ROWLOCK) WHERE Due < GETUTCDATE() ORDER BY Due;

-- unicode: delete_delayed
DELETE FROM [ünï].[東京 queue.Delayed] WHERE RowVersion IN (SELECT CAST(j.value AS bigint) FROM OPENJSON(@p_keys) AS j);

-- unicode: next_due
SELECT DATEDIFF_BIG(millisecond, GETUTCDATE(), min(Due)) FROM [ünï].[東京 queue.Delayed] WITH (READPAST, READCOMMITTEDLOCK);

-- unicode: create_subscriptions[0]
IF OBJECT_ID(N'[ünï].[SubscriptionRouting]', N'U') IS NULL CREATE TABLE [ünï].[SubscriptionRouting] (QueueAddress nvarchar(200) NOT NULL, Endpoint nvarchar(200) NOT NULL, Topic nvarchar(200) NOT NULL, PRIMARY KEY (Endpoint, Topic));

-- unicode: subscribe
MERGE [ünï].[SubscriptionRouting] WITH (HOLDLOCK, TABLOCK) AS target USING (SELECT CAST(@p_endpoint AS nvarchar(200)) AS Endpoint, CAST(@p_address AS nvarchar(200)) AS QueueAddress, CAST(@p_topic AS nvarchar(200)) AS Topic) AS source ON target.Endpoint = source.Endpoint AND target.Topic = source.Topic WHEN MATCHED AND target.QueueAddress <> source.QueueAddress THEN UPDATE SET QueueAddress = source.QueueAddress WHEN NOT MATCHED THEN INSERT (QueueAddress, Topic, Endpoint) VALUES (source.QueueAddress, source.Topic, source.Endpoint);;

-- unicode: unsubscribe
DELETE FROM [ünï].[SubscriptionRouting] WHERE Endpoint = @p_endpoint AND Topic = @p_topic;

-- unicode: subscribers
SELECT DISTINCT QueueAddress FROM [ünï].[SubscriptionRouting] WHERE Topic IN (SELECT CAST(j.value AS nvarchar(200)) FROM OPENJSON(@p_topics) AS j) ORDER BY QueueAddress;

-- unicode: grant_runtime[0]
GRANT SELECT, INSERT, UPDATE, DELETE ON [ünï].[東京 queue] TO [app]]rt];

-- unicode: can_insert
SELECT CAST(HAS_PERMS_BY_NAME(@p_table, 'OBJECT', 'INSERT') AS bit);

-- session: setup
SET ANSI_NULLS ON; SET ANSI_PADDING ON; SET ANSI_WARNINGS ON; SET ARITHABORT ON; SET CONCAT_NULL_YIELDS_NULL ON; SET QUOTED_IDENTIFIER ON; SET NUMERIC_ROUNDABORT OFF; SET TRANSACTION ISOLATION LEVEL READ COMMITTED; SET XACT_ABORT ON;

-- session: open_transactions
SELECT @@TRANCOUNT;

-- session: begin
BEGIN TRANSACTION;

-- session: commit
IF XACT_STATE() = -1 BEGIN ROLLBACK TRANSACTION; END; IF @@TRANCOUNT = 0 BEGIN RAISERROR(N'sqlqueue: the transaction was rolled back by an error inside it (SET XACT_ABORT ON); nothing of it was committed, and statements run after that error ran on their own', 16, 1); RETURN; END; COMMIT TRANSACTION;

-- session: rollback
IF @@TRANCOUNT > 0 ROLLBACK TRANSACTION;
