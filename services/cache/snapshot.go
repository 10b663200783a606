package cache

import (
	"bufio"
	"encoding/gob"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// snapshotMagic and snapshotVersion open every snapshot. A file of another version is not
// read: the cache starts empty, which is always safe.
const (
	snapshotMagic   = "mantle.cache.snapshot"
	snapshotVersion = 1
)

type snapshotHeader struct {
	Magic   string
	Version int
	Entries int
}

type snapshotRecord struct {
	Entry   Entry
	Dense   []float32
	Indices []uint32
	Values  []float32
}

// Save writes every entry, most recently used first, with its vector. Lookups go on
// while it runs; stores wait for it.
func (x *EmbeddedIndex) Save(w io.Writer) error {
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.lruMu.Lock()
	nodes := make([]*node, 0, x.recency.Len())
	for el := x.recency.Front(); el != nil; el = el.Next() {
		nodes = append(nodes, el.Value.(*node))
	}
	x.lruMu.Unlock()

	enc := gob.NewEncoder(w)
	if err := enc.Encode(snapshotHeader{Magic: snapshotMagic, Version: snapshotVersion, Entries: len(nodes)}); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	for _, n := range nodes {
		rec := snapshotRecord{Entry: n.entry, Dense: n.vec.Dense, Indices: n.vec.Indices, Values: n.vec.Values}
		if err := enc.Encode(&rec); err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
	}
	return nil
}

// LoadStats counts what Load did with a snapshot's entries.
type LoadStats struct {
	Loaded int
	// Expired entries were past their StaleUntil; OtherNamespace ones were stored under
	// another embedder, whose vectors no lookup could compare any more; Overflow ones did
	// not fit max_entries.
	Expired, OtherNamespace, Overflow int
}

// Load adds the entries of a snapshot written by Save to an empty index, keeping their
// recency order, and drops those past their StaleUntil at now or stored under another
// namespace than the current embedder's.
func (x *EmbeddedIndex) Load(r io.Reader, now time.Time, namespace string) (LoadStats, error) {
	var stats LoadStats
	dec := gob.NewDecoder(r)
	var h snapshotHeader
	if err := dec.Decode(&h); err != nil {
		return stats, fmt.Errorf("snapshot header: %w", err)
	}
	if h.Magic != snapshotMagic || h.Version != snapshotVersion {
		return stats, fmt.Errorf("snapshot: %q version %d, want %q version %d", h.Magic, h.Version, snapshotMagic, snapshotVersion)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if len(x.byKey) != 0 {
		return stats, errors.New("snapshot: load into a non-empty index")
	}
	for range h.Entries {
		var rec snapshotRecord
		if err := dec.Decode(&rec); err != nil {
			return stats, fmt.Errorf("snapshot entry %d: %w", stats.Loaded+stats.Expired+stats.OtherNamespace+stats.Overflow, err)
		}
		switch {
		case !rec.Entry.heldAt(now):
			stats.Expired++
			continue
		case rec.Entry.Namespace != namespace:
			stats.OtherNamespace++
			continue
		case len(x.byKey) >= x.maxEntries:
			stats.Overflow++
			continue
		}
		v := vector.Vector{Dense: rec.Dense, Indices: rec.Indices, Values: rec.Values}
		if _, dup := x.byKey[rec.Entry.Key]; dup {
			continue
		}
		// Entries come most recent first, so each goes behind the ones before it.
		if err := x.insert(rec.Entry, v, false); err != nil {
			return stats, err
		}
		stats.Loaded++
	}
	return stats, nil
}

// SaveFile writes a snapshot to path atomically: to a temporary file in the same directory,
// synced, then renamed over path, so a crash leaves the old snapshot or the new one, never
// half of one. The file is readable by its owner only: it holds tenants' prompts and
// answers.
func (x *EmbeddedIndex) SaveFile(path string) (err error) {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	f, err := os.CreateTemp(dir, filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()           // already failing; the close error adds nothing
			_ = os.Remove(f.Name()) // best effort: a stray temporary file is harmless
		}
	}()
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	w := bufio.NewWriterSize(f, 1<<20)
	if err := x.Save(w); err != nil {
		return err
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	if err := os.Rename(f.Name(), path); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// LoadFile loads the snapshot at path; a missing file is an empty cache, not an error.
func (x *EmbeddedIndex) LoadFile(path string, now time.Time, namespace string) (LoadStats, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return LoadStats{}, nil
	}
	if err != nil {
		return LoadStats{}, fmt.Errorf("snapshot: %w", err)
	}
	defer func() { _ = f.Close() }() // read-only: a close error loses nothing
	return x.Load(bufio.NewReaderSize(f, 1<<20), now, namespace)
}
