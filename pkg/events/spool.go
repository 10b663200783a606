package events

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrSpoolFull is returned by Spool.Append when the spool holds its limit of records or
// bytes: the caller decides whether to drop the message or fail.
var ErrSpoolFull = errors.New("spool is full")

// ErrRecordTooLarge is returned by Spool.Append for a record over SpoolLimits.MaxRecordBytes:
// it could never be published, and would only wait in the queue. Callers bound their
// payloads (truncating with a marker) before they spool them.
var ErrRecordTooLarge = errors.New("spool record too large")

// errRejected marks a publish error as the record's own fault (over the server's payload
// limit, refused by the stream), which no retry will cure.
var errRejected = errors.New("rejected by the server")

// Rejected marks err, returned by a Flush publish function, as permanent for this record:
// Flush moves the record to the dead-letter directory and goes on with the next one,
// instead of stopping there and retrying it forever in front of every other record.
func Rejected(err error) error { return fmt.Errorf("%w: %w", errRejected, err) }

// SpoolRecord is one message waiting in a spool.
type SpoolRecord struct {
	// Seq orders records; Append assigns it.
	Seq     uint64
	Subject string
	// MsgID is the de-duplication id (JetStream's Nats-Msg-Id): a record replayed after a
	// crash between publishing and deleting it is dropped by the server, not delivered twice.
	MsgID string
	Data  []byte
}

// SpoolLimits bound a spool so that a long NATS outage fills a disk quota, not the disk.
type SpoolLimits struct {
	// MaxRecords is the most records kept; 0 means 100 000.
	MaxRecords int
	// MaxBytes is the most payload bytes kept; 0 means 256 MiB.
	MaxBytes int64
	// MaxRecordBytes is the largest record Append accepts; 0 means 1 MiB, NATS's default
	// max_payload.
	MaxRecordBytes int
}

// Spool is a durable first-in first-out queue of messages on local disk, for messages that
// must not be lost while NATS is unreachable (review requests). Append returns once the
// record is on disk (written, fsynced and renamed into place); Flush hands records to a
// publish function in order and deletes each one only after it was published.
//
// Each record is one file named by its sequence number, so a crash can leave at most a
// temporary file behind (removed on open) and never a half-written record. One directory
// belongs to one process: two processes sharing a spool would publish each other's records.
// A Spool is safe for concurrent use; Flush calls are serialised.
type Spool struct {
	dir    string
	limits SpoolLimits

	mu    sync.Mutex // guards next, count, bytes
	next  uint64
	count int
	bytes int64

	flushMu sync.Mutex // one Flush at a time, so records are published in order

	metrics atomic.Pointer[spoolMetrics] // nil until Instrument
	// onDeadLetter, when set, hears of every record Flush moved aside.
	onDeadLetter atomic.Pointer[func(rec SpoolRecord, err error)]
}

const (
	spoolSuffix  = ".rec"
	spoolTmp     = ".tmp-"
	spoolCorrupt = "corrupt"
	// spoolDead holds records the server refused for good (Rejected), for an operator.
	spoolDead = "dead"
)

// spoolMagic starts every record file; the last byte is the format version.
var spoolMagic = []byte{'M', 'S', 'P', 1}

// OpenSpool opens (creating it if needed) the spool in dir and recovers the records a
// previous process left there.
func OpenSpool(dir string, limits SpoolLimits) (*Spool, error) {
	if limits.MaxRecords <= 0 {
		limits.MaxRecords = 100_000
	}
	if limits.MaxBytes <= 0 {
		limits.MaxBytes = 256 << 20
	}
	if limits.MaxRecordBytes <= 0 {
		limits.MaxRecordBytes = 1 << 20
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	s := &Spool{dir: dir, limits: limits, next: 1}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		switch {
		case strings.HasPrefix(name, spoolTmp):
			// A write that never reached its rename: the caller was never told it succeeded.
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				return nil, fmt.Errorf("spool: remove unfinished record: %w", err)
			}
		case strings.HasSuffix(name, spoolSuffix):
			seq, ok := parseSpoolName(name)
			if !ok {
				continue
			}
			info, err := e.Info()
			if err != nil {
				return nil, fmt.Errorf("spool: %w", err)
			}
			s.count++
			s.bytes += info.Size()
			s.next = max(s.next, seq+1)
		}
	}
	return s, nil
}

// Dir is the spool's directory.
func (s *Spool) Dir() string { return s.dir }

// Len is the number of records waiting.
func (s *Spool) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.count
}

// Append stores rec durably and returns its sequence number. It returns ErrSpoolFull when
// the spool is at its limits.
func (s *Spool) Append(rec SpoolRecord) (uint64, error) {
	if len(rec.Data) > s.limits.MaxRecordBytes {
		if m := s.metrics.Load(); m != nil {
			m.dropped.WithLabelValues(rec.Subject, dropTooLarge).Inc()
		}
		return 0, fmt.Errorf("%w: %d bytes, the limit is %d", ErrRecordTooLarge, len(rec.Data), s.limits.MaxRecordBytes)
	}
	data := encodeSpoolRecord(rec)
	s.mu.Lock()
	if s.count >= s.limits.MaxRecords || s.bytes+int64(len(data)) > s.limits.MaxBytes {
		s.mu.Unlock()
		if m := s.metrics.Load(); m != nil {
			m.dropped.WithLabelValues(rec.Subject, dropSpoolFull).Inc()
		}
		return 0, ErrSpoolFull
	}
	seq := s.next
	s.next++
	// Reserve the space before the slow disk write so concurrent appends respect the limits.
	s.count++
	s.bytes += int64(len(data))
	s.mu.Unlock()

	if err := s.write(seq, data); err != nil {
		s.mu.Lock()
		s.count--
		s.bytes -= int64(len(data))
		s.mu.Unlock()
		return 0, err
	}
	if m := s.metrics.Load(); m != nil {
		m.spooled.WithLabelValues(rec.Subject).Inc()
	}
	return seq, nil
}

func (s *Spool) write(seq uint64, data []byte) error {
	tmp := filepath.Join(s.dir, spoolTmp+strconv.FormatUint(seq, 10))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, spoolName(seq)))
	}
	if err == nil {
		err = syncDir(s.dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("spool: write record %d: %w", seq, err)
	}
	return nil
}

// Flush publishes the waiting records in order, deleting each one after publish returns
// nil, and stops at the first error (returned wrapped), so that order is kept and nothing is
// skipped. It returns how many records it published. Two kinds of record must not block the
// records behind them, and are moved aside for an operator instead: one that cannot be read
// back (damaged on disk) goes to corrupt/, one the server refused for good (publish
// returned a Rejected error) to dead/, counted in mantle_events_dead_lettered_total.
func (s *Spool) Flush(ctx context.Context, publish func(ctx context.Context, rec SpoolRecord) error) (int, error) {
	s.flushMu.Lock()
	defer s.flushMu.Unlock()
	seqs, err := s.pending()
	if err != nil {
		return 0, err
	}
	published := 0
	for _, seq := range seqs {
		if err := ctx.Err(); err != nil {
			return published, fmt.Errorf("spool flush: %w", err)
		}
		path := filepath.Join(s.dir, spoolName(seq))
		raw, err := os.ReadFile(path)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return published, fmt.Errorf("spool: read record %d: %w", seq, err)
		}
		rec, err := decodeSpoolRecord(raw)
		if err != nil {
			if err := s.moveAside(spoolCorrupt, path, int64(len(raw))); err != nil {
				return published, err
			}
			continue
		}
		rec.Seq = seq
		if err := publish(ctx, rec); errors.Is(err, errRejected) {
			if err := s.moveAside(spoolDead, path, int64(len(raw))); err != nil {
				return published, err
			}
			if m := s.metrics.Load(); m != nil {
				m.deadLettered.WithLabelValues(rec.Subject).Inc()
			}
			if f := s.onDeadLetter.Load(); f != nil {
				(*f)(rec, err)
			}
			continue
		} else if err != nil {
			return published, fmt.Errorf("spool: publish record %d: %w", seq, err)
		}
		if err := os.Remove(path); err != nil {
			return published, fmt.Errorf("spool: delete published record %d: %w", seq, err)
		}
		s.forget(int64(len(raw)))
		if m := s.metrics.Load(); m != nil {
			m.replayed.WithLabelValues(rec.Subject).Inc()
		}
		published++
	}
	return published, nil
}

// OnDeadLetter installs a callback that hears of every record Flush moves to dead/ (to log
// it); it runs on the flushing goroutine.
func (s *Spool) OnDeadLetter(f func(rec SpoolRecord, err error)) { s.onDeadLetter.Store(&f) }

// PublishToJetStream returns a Flush publish function that publishes each record to
// JetStream and waits for the stream's acknowledgement, with the record's MsgID as
// Nats-Msg-Id so that a record replayed after a crash is de-duplicated by the server. A
// record over the connection's max payload, or one the stream refuses as too large, is
// Rejected.
func PublishToJetStream(js jetstream.JetStream) func(ctx context.Context, rec SpoolRecord) error {
	return func(ctx context.Context, rec SpoolRecord) error {
		// The server announces its limit on connect; over it, the client refuses the message
		// before sending, every time.
		if nc := js.Conn(); nc != nil && nc.MaxPayload() > 0 && int64(len(rec.Data)) > nc.MaxPayload() {
			return Rejected(fmt.Errorf("%d bytes is over the server's max payload of %d", len(rec.Data), nc.MaxPayload()))
		}
		msg := nats.NewMsg(rec.Subject)
		msg.Data = rec.Data
		var opts []jetstream.PublishOpt
		if rec.MsgID != "" {
			opts = append(opts, jetstream.WithMsgID(rec.MsgID))
		}
		_, err := js.PublishMsg(ctx, msg, opts...)
		if errors.Is(err, nats.ErrMaxPayload) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) {
			return Rejected(err)
		}
		return err
	}
}

// pending lists the sequence numbers on disk, oldest first.
func (s *Spool) pending() ([]uint64, error) {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("spool: %w", err)
	}
	var seqs []uint64
	for _, e := range entries {
		if seq, ok := parseSpoolName(e.Name()); ok {
			seqs = append(seqs, seq)
		}
	}
	slices.Sort(seqs)
	return seqs, nil
}

// moveAside moves a record that must not block the others into the subdirectory sub.
func (s *Spool) moveAside(sub, path string, size int64) error {
	dir := filepath.Join(s.dir, sub)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("spool: %w", err)
	}
	if err := os.Rename(path, filepath.Join(dir, filepath.Base(path))); err != nil {
		return fmt.Errorf("spool: move record to %s/: %w", sub, err)
	}
	s.forget(size)
	return nil
}

func (s *Spool) forget(size int64) {
	s.mu.Lock()
	s.count--
	s.bytes -= size
	s.mu.Unlock()
}

func spoolName(seq uint64) string { return fmt.Sprintf("%020d%s", seq, spoolSuffix) }

func parseSpoolName(name string) (uint64, bool) {
	digits, ok := strings.CutSuffix(name, spoolSuffix)
	if !ok {
		return 0, false
	}
	seq, err := strconv.ParseUint(digits, 10, 64)
	return seq, err == nil
}

// encodeSpoolRecord lays a record out as magic, three length-prefixed fields (subject,
// msg id, data) and a CRC-32C of everything before it.
func encodeSpoolRecord(rec SpoolRecord) []byte {
	buf := make([]byte, 0, len(spoolMagic)+3*binary.MaxVarintLen64+len(rec.Subject)+len(rec.MsgID)+len(rec.Data)+4)
	buf = append(buf, spoolMagic...)
	for _, field := range [][]byte{[]byte(rec.Subject), []byte(rec.MsgID), rec.Data} {
		buf = binary.AppendUvarint(buf, uint64(len(field)))
		buf = append(buf, field...)
	}
	return binary.BigEndian.AppendUint32(buf, crc32.Checksum(buf, crcTable))
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

var errBadRecord = errors.New("damaged spool record")

func decodeSpoolRecord(raw []byte) (SpoolRecord, error) {
	if len(raw) < len(spoolMagic)+4 || !bytes.Equal(raw[:len(spoolMagic)], spoolMagic) {
		return SpoolRecord{}, errBadRecord
	}
	body, sum := raw[:len(raw)-4], binary.BigEndian.Uint32(raw[len(raw)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return SpoolRecord{}, errBadRecord
	}
	rest := body[len(spoolMagic):]
	var fields [3][]byte
	for i := range fields {
		n, size := binary.Uvarint(rest)
		if size <= 0 || n > uint64(len(rest)-size) {
			return SpoolRecord{}, errBadRecord
		}
		fields[i] = rest[size : size+int(n)]
		rest = rest[size+int(n):]
	}
	if len(rest) != 0 {
		return SpoolRecord{}, errBadRecord
	}
	return SpoolRecord{Subject: string(fields[0]), MsgID: string(fields[1]), Data: bytes.Clone(fields[2])}, nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
