package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	_ "modernc.org/sqlite"             // database/sql driver "sqlite", pure Go

	"github.com/safeack/safeack"
)

// store is the sink's table in SQLite or PostgreSQL. Each record is one
// row keyed by (topic, partition, offset): writing a record again (a
// redelivery after a crash or a rebalance) changes nothing, so
// at-least-once delivery gives exactly one row per record.
type store struct {
	db       *sql.DB
	postgres bool
	// delay holds each batch's transaction open this long before it
	// commits: a slow database, for demonstrations and crash tests.
	delay time.Duration
}

// maxRowsPerStatement keeps an INSERT's parameters (6 a row) below
// SQLite's and PostgreSQL's limits (32,766 and 65,535).
const maxRowsPerStatement = 1000

// openStore opens the SQLite file at path, or PostgreSQL when dsn is not
// empty, and creates the table if it does not exist.
func openStore(ctx context.Context, path, dsn string) (*store, error) {
	s := &store{postgres: dsn != ""}
	var err error
	if s.postgres {
		s.db, err = sql.Open("pgx", dsn)
	} else {
		// WAL: readers (another process counting rows) never block the
		// writer; busy_timeout: a second sink process on the same file
		// waits for the write lock instead of failing at once.
		// synchronous stays FULL (the default): a committed batch
		// survives a power loss, not only a crash of the process.
		s.db, err = sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
		s.db.SetMaxOpenConns(1) // one writer per process; SQLite allows one at a time anyway
	}
	if err != nil {
		return nil, err
	}
	ddl := `CREATE TABLE IF NOT EXISTS sink_records (
	topic           TEXT    NOT NULL,
	kafka_partition INTEGER NOT NULL,
	kafka_offset    BIGINT  NOT NULL,
	record_key      BLOB,
	payload         BLOB    NOT NULL,
	uuid            TEXT    NOT NULL,
	PRIMARY KEY (topic, kafka_partition, kafka_offset)
)`
	if s.postgres {
		ddl = strings.ReplaceAll(ddl, "BLOB", "BYTEA")
	}
	if _, err := s.db.ExecContext(ctx, ddl); err != nil {
		_ = s.db.Close()
		return nil, fmt.Errorf("creating the table: %w", err)
	}
	return s, nil
}

func (s *store) Close() error { return s.db.Close() }

// errNoPosition: a message that did not come from Kafka through safeack
// has no (topic, partition, offset) to key its row.
var errNoPosition = errors.New("sink: message without a Kafka position")

// write upserts msgs in one transaction and returns how many rows it
// inserted (records written before are left as they are). A message
// without a Kafka position fails alone (a *safeack.BatchError names it);
// a database error fails them all, and the transaction writes nothing.
func (s *store) write(ctx context.Context, msgs []*message.Message) (inserted int64, err error) {
	var failed safeack.BatchError
	rows := make([]any, 0, 6*len(msgs))
	for _, m := range msgs {
		topic, ok1 := safeack.MessageTopicFromCtx(m.Context())
		partition, ok2 := safeack.MessagePartitionFromCtx(m.Context())
		offset, ok3 := safeack.MessagePartitionOffsetFromCtx(m.Context())
		if !ok1 || !ok2 || !ok3 {
			failed.Fail(m, errNoPosition)
			continue
		}
		key, _ := safeack.MessageKeyFromCtx(m.Context())
		rows = append(rows, topic, partition, offset, key, []byte(m.Payload), m.UUID)
	}
	if len(rows) > 0 {
		if inserted, err = s.insert(ctx, rows); err != nil {
			return 0, err
		}
	}
	if failed.Len() > 0 {
		return inserted, &failed
	}
	return inserted, nil
}

// insert writes rows (6 values each) in one transaction.
func (s *store) insert(ctx context.Context, rows []any) (int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: a no-op
	var inserted int64
	for len(rows) > 0 {
		n := min(len(rows)/6, maxRowsPerStatement)
		res, err := tx.ExecContext(ctx, s.insertStatement(n), rows[:6*n]...)
		if err != nil {
			return 0, fmt.Errorf("inserting %d rows: %w", n, err)
		}
		affected, _ := res.RowsAffected()
		inserted += affected
		rows = rows[6*n:]
	}
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("committing: %w", err)
	}
	return inserted, nil
}

// insertStatement is the INSERT of n rows, in the database's placeholder
// style, leaving rows already present untouched.
func (s *store) insertStatement(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO sink_records (topic, kafka_partition, kafka_offset, record_key, payload, uuid) VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('(')
		for j := range 6 {
			if j > 0 {
				b.WriteByte(',')
			}
			if s.postgres {
				fmt.Fprintf(&b, "$%d", 6*i+j+1)
			} else {
				b.WriteByte('?')
			}
		}
		b.WriteByte(')')
	}
	b.WriteString(" ON CONFLICT (topic, kafka_partition, kafka_offset) DO NOTHING")
	return b.String()
}

// countBelow returns how many rows of topic's partition have an offset
// below end.
func (s *store) countBelow(ctx context.Context, topic string, partition int32, end int64) (int64, error) {
	q := "SELECT COUNT(*) FROM sink_records WHERE topic = ? AND kafka_partition = ? AND kafka_offset < ?"
	if s.postgres {
		q = "SELECT COUNT(*) FROM sink_records WHERE topic = $1 AND kafka_partition = $2 AND kafka_offset < $3"
	}
	var n int64
	err := s.db.QueryRowContext(ctx, q, topic, partition, end).Scan(&n)
	return n, err
}

// count returns the number of rows of topic.
func (s *store) count(ctx context.Context, topic string) (int64, error) {
	q := "SELECT COUNT(*) FROM sink_records WHERE topic = ?"
	if s.postgres {
		q = "SELECT COUNT(*) FROM sink_records WHERE topic = $1"
	}
	var n int64
	err := s.db.QueryRowContext(ctx, q, topic).Scan(&n)
	return n, err
}
