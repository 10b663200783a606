package cache

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// A snapshot is read from a file anyone with write access to the disk could have damaged, so
// its format lets the reader bound every allocation before making it:
//
//	magic (8 bytes "MNTLCSNP") | version (uint16, big endian)
//	record*: length (uint32) | body (length bytes) | CRC-32C of body (uint32)
//	end:     length 0 | record count (uint64)
//
// A body is the entry's fields in a fixed order, strings and byte strings as a uvarint
// length and the bytes, integers as varints, times in time.Time's binary form, then the
// vector: a kind byte (0 none, 1 dense, 2 sparse), a uvarint count and the coordinates.
// Every length is checked against what is left of its body, and the body against
// maxRecordBytes and what is left of the file's limit, before anything is allocated; a
// file without its end is refused, so a truncated snapshot is never taken for a whole one.
const (
	snapshotMagic   = "MNTLCSNP"
	snapshotVersion = 2

	// maxRecordBytes bounds one record: an entry comes from one Store call, itself bounded
	// by server.max_message_bytes (16 MiB by default), plus its vector.
	maxRecordBytes = 64 << 20
	// maxVectorLen bounds a vector's coordinates (dense) or non-zero ones (sparse): 16 times
	// the largest embedding model's 3072 dimensions, and more distinct words than any
	// prompt within the record limit carries.
	maxVectorLen = 1 << 20
	// DefaultSnapshotMaxBytes is embedded.snapshot_max_bytes when unset.
	DefaultSnapshotMaxBytes = 1 << 30
)

// ErrSnapshotOldFormat is returned for a snapshot written by a mantle whose format (gob,
// version 1) cannot be read with bounded memory. The cache starts empty; the next snapshot
// is written in the current format.
var ErrSnapshotOldFormat = errors.New("snapshot: format 1 (gob), written by an older mantle, is not read: it cannot be decoded with bounded memory")

// ErrSnapshotTooLarge is returned when a snapshot is larger than its limit.
var ErrSnapshotTooLarge = errors.New("snapshot: larger than embedded.snapshot_max_bytes")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// SaveStats counts what Save wrote.
type SaveStats struct {
	Written int
	// Dropped entries, the least recently used, did not fit within the size limit.
	Dropped int
	Bytes   int64
}

// Save writes every entry, most recently used first, with its vector, in at most maxBytes:
// the least recently used entries that would go past it are dropped (and counted), so that
// the file can always be read back under the same limit. Lookups go on while it runs;
// stores wait for it.
func (x *EmbeddedIndex) Save(w io.Writer, maxBytes int64) (SaveStats, error) {
	x.lockRead()
	defer x.unlockRead()
	x.lruMu.Lock()
	nodes := make([]*node, 0, len(x.byKey))
	for r := x.recency.front; r != 0; r = x.nodes.at(r).next {
		nodes = append(nodes, x.nodes.at(r))
	}
	x.lruMu.Unlock()

	var stats SaveStats
	write := func(b []byte) error {
		n, err := w.Write(b)
		stats.Bytes += int64(n)
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		return nil
	}
	head := binary.BigEndian.AppendUint16([]byte(snapshotMagic), snapshotVersion)
	const endBytes = 4 + 8
	if int64(len(head))+endBytes > maxBytes {
		return stats, fmt.Errorf("%w: %d bytes cannot hold even an empty snapshot", ErrSnapshotTooLarge, maxBytes)
	}
	if err := write(head); err != nil {
		return stats, err
	}
	var body, frame []byte
	for _, n := range nodes {
		body = appendRecord(body[:0], n.entry.entry(), x.vectorOf(n))
		if len(body) > maxRecordBytes || stats.Bytes+int64(len(body))+8+endBytes > maxBytes {
			// Too large alone, or past the file's limit: the rest are older, and each is
			// tried, since a smaller one may still fit.
			stats.Dropped++
			continue
		}
		frame = binary.BigEndian.AppendUint32(frame[:0], uint32(len(body)))
		frame = append(frame, body...)
		frame = binary.BigEndian.AppendUint32(frame, crc32.Checksum(body, castagnoli))
		if err := write(frame); err != nil {
			return stats, err
		}
		stats.Written++
	}
	end := binary.BigEndian.AppendUint64(make([]byte, 4), uint64(stats.Written))
	if err := write(end); err != nil {
		return stats, err
	}
	return stats, nil
}

// appendRecord appends e and v's record body to b.
func appendRecord(b []byte, e Entry, v vector.Vector) []byte {
	b = appendString(b, e.ID)
	b = append(b, e.Key[:]...)
	b = append(b, e.Partition[:]...)
	for _, s := range []string{e.Tenant, e.Scenario, e.Namespace, e.Question, e.Content, e.SourceModel, e.FinishReason} {
		b = appendString(b, s)
	}
	b = binary.AppendVarint(b, e.Usage.InputTokens)
	b = binary.AppendVarint(b, e.Usage.OutputTokens)
	b = binary.AppendVarint(b, e.Usage.TotalTokens)
	for _, t := range []time.Time{e.CreatedAt, e.ExpiresAt, e.StaleUntil} {
		// MarshalBinary fails only for a zone offset that is not whole minutes, which
		// time.Now and time.Unix never produce; such a time is written as the zero time.
		tb, _ := t.MarshalBinary()
		b = appendString(b, string(tb))
	}
	b = binary.AppendUvarint(b, uint64(len(e.ToolCalls)))
	for _, c := range e.ToolCalls {
		for _, s := range []string{c.ID, c.Type, c.Name, c.Arguments} {
			b = appendString(b, s)
		}
	}
	switch {
	case v.Len() == 0:
		b = append(b, 0)
	case !v.Sparse():
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(v.Dense)))
		for _, f := range v.Dense {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
		}
	default:
		b = append(b, 2)
		b = binary.AppendUvarint(b, uint64(len(v.Indices)))
		for i, ix := range v.Indices {
			b = binary.LittleEndian.AppendUint32(b, ix)
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v.Values[i]))
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// LoadStats counts what Load did with a snapshot's entries.
type LoadStats struct {
	Loaded int
	// Expired entries were past their StaleUntil; OtherNamespace ones were stored under
	// another embedder, whose vectors no lookup could compare any more; Overflow ones did
	// not fit max_entries or max_bytes.
	Expired, OtherNamespace, Overflow int
}

// Load adds the entries of a snapshot written by Save to an empty index, keeping their
// recency order, and drops those past their StaleUntil at now or stored under another
// namespace than the current embedder's. It reads at most maxBytes and allocates no more
// than the bytes it has read (see the format above). On error the index may hold some of
// the entries: the caller discards it.
func (x *EmbeddedIndex) Load(r io.Reader, maxBytes int64, now time.Time, namespace string) (LoadStats, error) {
	var stats LoadStats
	lr := &io.LimitedReader{R: r, N: maxBytes}
	head := make([]byte, len(snapshotMagic)+2)
	if _, err := io.ReadFull(lr, head); err != nil || string(head[:len(snapshotMagic)]) != snapshotMagic {
		// Format 1 names its first gob type within its first bytes; reading a few more
		// tells an old snapshot from garbage, so the operator learns why the cache is empty.
		more := make([]byte, 32)
		n, _ := io.ReadFull(lr, more)
		if bytes.Contains(append(head, more[:n]...), []byte("snapshotHeader")) {
			return stats, ErrSnapshotOldFormat
		}
		if err != nil {
			return stats, fmt.Errorf("snapshot header: %w", noEOF(err))
		}
		return stats, errors.New("snapshot: not a mantle cache snapshot")
	}
	if v := binary.BigEndian.Uint16(head[len(snapshotMagic):]); v != snapshotVersion {
		return stats, fmt.Errorf("snapshot: version %d, this mantle reads version %d", v, snapshotVersion)
	}
	x.lockWrite()
	defer x.unlockWrite()
	if len(x.byKey) != 0 {
		return stats, errors.New("snapshot: load into a non-empty index")
	}
	var (
		word  [8]byte
		body  bytes.Buffer
		count uint64
	)
	for {
		if _, err := io.ReadFull(lr, word[:4]); err != nil {
			return stats, snapshotReadError(lr, fmt.Errorf("snapshot record %d: %w", count, err))
		}
		size := binary.BigEndian.Uint32(word[:4])
		if size == 0 {
			break
		}
		if size > maxRecordBytes {
			return stats, fmt.Errorf("snapshot record %d: %d bytes, over the limit of %d", count, size, maxRecordBytes)
		}
		if int64(size)+4 > lr.N {
			return stats, fmt.Errorf("snapshot record %d: %d bytes: %w", count, size, ErrSnapshotTooLarge)
		}
		// CopyN grows the buffer as bytes arrive, so a length that lies costs no more
		// memory than the bytes actually there.
		body.Reset()
		if _, err := io.CopyN(&body, lr, int64(size)); err != nil {
			return stats, fmt.Errorf("snapshot record %d: %w", count, noEOF(err))
		}
		if _, err := io.ReadFull(lr, word[:4]); err != nil {
			return stats, fmt.Errorf("snapshot record %d: %w", count, noEOF(err))
		}
		if sum := crc32.Checksum(body.Bytes(), castagnoli); sum != binary.BigEndian.Uint32(word[:4]) {
			return stats, fmt.Errorf("snapshot record %d: checksum mismatch: the file is damaged", count)
		}
		e, v, err := decodeRecord(body.Bytes())
		if err != nil {
			return stats, fmt.Errorf("snapshot record %d: %w", count, err)
		}
		count++
		switch {
		case !e.heldAt(now):
			stats.Expired++
			continue
		case e.Namespace != namespace:
			stats.OtherNamespace++
			continue
		case len(x.byKey) >= x.maxEntries || (x.maxBytes > 0 && x.bytes+entrySize(e, v) > x.maxBytes):
			stats.Overflow++
			continue
		}
		if _, dup := x.byKey[e.Key]; dup {
			continue
		}
		// Entries come most recent first, so each goes behind the ones before it.
		if err := x.insert(e, v, nil, false); err != nil {
			return stats, fmt.Errorf("snapshot record %d: %w", count-1, err)
		}
		stats.Loaded++
	}
	if _, err := io.ReadFull(lr, word[:]); err != nil {
		return stats, snapshotReadError(lr, fmt.Errorf("snapshot end: %w", noEOF(err)))
	}
	if n := binary.BigEndian.Uint64(word[:]); n != count {
		return stats, fmt.Errorf("snapshot end: %d records announced, %d read: the file is damaged", n, count)
	}
	return stats, nil
}

// snapshotReadError names the size limit when it is what stopped the read.
func snapshotReadError(lr *io.LimitedReader, err error) error {
	if lr.N <= 0 {
		return fmt.Errorf("%w: %w", ErrSnapshotTooLarge, err)
	}
	return noEOF(err)
}

// noEOF reports a snapshot that ends early as truncated: io.EOF would read as success.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return fmt.Errorf("truncated: %w", io.ErrUnexpectedEOF)
	}
	return err
}

// decodeRecord reads one record body. Every length is checked against what is left of b
// before anything is allocated.
func decodeRecord(b []byte) (Entry, vector.Vector, error) {
	d := decoder{b: b}
	var e Entry
	e.ID = d.string("id")
	d.fixed(e.Key[:], "key")
	d.fixed(e.Partition[:], "partition")
	for _, f := range []struct {
		dst  *string
		name string
	}{
		{&e.Tenant, "tenant"}, {&e.Scenario, "scenario"}, {&e.Namespace, "namespace"},
		{&e.Question, "question"}, {&e.Content, "content"}, {&e.SourceModel, "source_model"},
		{&e.FinishReason, "finish_reason"},
	} {
		*f.dst = d.string(f.name)
	}
	e.Usage.InputTokens = d.varint("input_tokens")
	e.Usage.OutputTokens = d.varint("output_tokens")
	e.Usage.TotalTokens = d.varint("total_tokens")
	for _, f := range []struct {
		dst  *time.Time
		name string
	}{{&e.CreatedAt, "created_at"}, {&e.ExpiresAt, "expires_at"}, {&e.StaleUntil, "stale_until"}} {
		raw := d.bytes(f.name, 32)
		if d.err == nil {
			if err := f.dst.UnmarshalBinary(raw); err != nil {
				d.fail("%s: %v", f.name, err)
			}
		}
	}
	// Each tool call is at least its four string lengths.
	if n := d.count("tool calls", 4); n > 0 && d.err == nil {
		e.ToolCalls = make([]ToolCall, n)
		for i := range e.ToolCalls {
			c := &e.ToolCalls[i]
			c.ID, c.Type, c.Name, c.Arguments = d.string("tool call id"), d.string("tool call type"), d.string("tool call name"), d.string("tool call arguments")
		}
	}
	var v vector.Vector
	switch kind := d.byte("vector kind"); kind {
	case 0:
	case 1:
		n := d.count("dense vector", 4)
		if n > 0 && d.err == nil {
			v.Dense = make([]float32, n)
			for i := range v.Dense {
				v.Dense[i] = d.float("dense vector")
			}
		}
	case 2:
		n := d.count("sparse vector", 8)
		if n > 0 && d.err == nil {
			v.Indices, v.Values = make([]uint32, n), make([]float32, n)
			for i := range v.Indices {
				v.Indices[i] = d.uint32()
				v.Values[i] = d.float("sparse vector")
				if i > 0 && v.Indices[i] <= v.Indices[i-1] && d.err == nil {
					d.fail("sparse vector: indices not strictly increasing at %d", i)
				}
			}
		}
	default:
		if d.err == nil {
			d.fail("vector kind %d, want 0, 1 or 2", kind)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("%d bytes after the vector", len(d.b))
	}
	if d.err != nil {
		return Entry{}, vector.Vector{}, d.err
	}
	if (v.Dense != nil || v.Indices != nil) && v.Len() == 0 {
		return Entry{}, vector.Vector{}, errors.New("vector without a non-zero coordinate")
	}
	return e, v, nil
}

// decoder reads a record body; the first error sticks and later reads return zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *decoder) take(n uint64, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n > uint64(len(d.b)) {
		d.fail("%s: %d bytes, only %d left in the record", what, n, len(d.b))
		return nil
	}
	out := d.b[:n]
	d.b = d.b[n:]
	return out
}

func (d *decoder) uvarint(what string) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("%s: bad length", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint(what string) int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("%s: bad number", what)
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) string(what string) string { return string(d.take(d.uvarint(what), what)) }

// bytes reads a length-prefixed byte string of at most limit bytes; it aliases the body.
func (d *decoder) bytes(what string, limit uint64) []byte {
	n := d.uvarint(what)
	if n > limit && d.err == nil {
		d.fail("%s: %d bytes, over the limit of %d", what, n, limit)
	}
	return d.take(n, what)
}

func (d *decoder) fixed(dst []byte, what string) { copy(dst, d.take(uint64(len(dst)), what)) }

func (d *decoder) byte(what string) byte {
	if b := d.take(1, what); len(b) == 1 {
		return b[0]
	}
	return 0
}

// count reads a vector's length and checks it against maxVectorLen and the bytes left
// (each coordinate taking size bytes).
func (d *decoder) count(what string, size uint64) int {
	n := d.uvarint(what)
	switch {
	case d.err != nil:
		return 0
	case n > maxVectorLen:
		d.fail("%s: %d coordinates, over the limit of %d", what, n, maxVectorLen)
		return 0
	case n*size > uint64(len(d.b)):
		d.fail("%s: %d coordinates, only %d bytes left in the record", what, n, len(d.b))
		return 0
	}
	return int(n)
}

func (d *decoder) uint32() uint32 {
	if b := d.take(4, "vector"); len(b) == 4 {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (d *decoder) float(what string) float32 {
	f := math.Float32frombits(d.uint32())
	if (math.IsNaN(float64(f)) || math.IsInf(float64(f), 0)) && d.err == nil {
		d.fail("%s: coordinate %v", what, f)
	}
	return f
}

// SaveFile writes a snapshot of at most maxBytes to path atomically: to a temporary file in
// the same directory, synced, then renamed over path, so a crash leaves the old snapshot or
// the new one, never half of one. The file is readable by its owner only: it holds
// tenants' prompts and answers.
func (x *EmbeddedIndex) SaveFile(path string, maxBytes int64) (stats SaveStats, err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return stats, fmt.Errorf("snapshot: %w", err)
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return stats, fmt.Errorf("snapshot: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()           // already failing; the close error adds nothing
			_ = os.Remove(f.Name()) // best effort: a stray temporary file is harmless
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return stats, fmt.Errorf("snapshot: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if stats, err = x.Save(w, maxBytes); err != nil {
		return stats, err
	}
	if err := w.Flush(); err != nil {
		return stats, fmt.Errorf("snapshot: %w", err)
	}
	if err := f.Sync(); err != nil {
		return stats, fmt.Errorf("snapshot: %w", err)
	}
	if err := f.Close(); err != nil {
		return stats, fmt.Errorf("snapshot: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return stats, fmt.Errorf("snapshot: %w", err)
	}
	return stats, nil
}

// LoadFile loads the snapshot at path, refusing one larger than maxBytes before reading it;
// a missing file is an empty cache, not an error.
func (x *EmbeddedIndex) LoadFile(path string, maxBytes int64, now time.Time, namespace string) (LoadStats, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return LoadStats{}, nil
	}
	if err != nil {
		return LoadStats{}, fmt.Errorf("snapshot: %w", err)
	}
	defer func() { _ = f.Close() }() // read-only: a close error loses nothing
	if info, err := f.Stat(); err == nil && info.Mode().IsRegular() && info.Size() > maxBytes {
		return LoadStats{}, fmt.Errorf("%w: %d bytes, limit %d", ErrSnapshotTooLarge, info.Size(), maxBytes)
	}
	return x.Load(bufio.NewReaderSize(f, 1<<20), maxBytes, now, namespace)
}
