package cache

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"
)

// snapshotHeader is format 1's first gob value, as an older mantle wrote it.
type snapshotHeader struct {
	Magic   string
	Version int
	Entries int
}

// oldFormatSnapshot returns the opening of a format 1 (gob) snapshot.
func oldFormatSnapshot(t testing.TB) []byte {
	var b bytes.Buffer
	if err := gob.NewEncoder(&b).Encode(snapshotHeader{Magic: "mantle.cache.snapshot", Version: 1, Entries: 1}); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// TestSnapshotKeepsEveryField: every field of Entry, and both vector forms, survive a save
// and load. A field added to Entry without the snapshot writing it fails here.
func TestSnapshotKeepsEveryField(t *testing.T) {
	t.Parallel()
	e := testEntry("id-1", "tenant", "scenario", "p", "question")
	e.SourceModel, e.FinishReason = "model", "length"
	e.Usage = Usage{InputTokens: 3, OutputTokens: -4, TotalTokens: 1 << 40}
	e.CreatedAt = epoch.Add(-time.Minute)
	e.ToolCalls = []ToolCall{{ID: "call_1", Type: "function", Name: "get_weather", Arguments: `{"city":"Paris"}`}, {ID: "call_2", Name: "f"}}
	rv := reflect.ValueOf(e)
	for i := range rv.NumField() {
		if rv.Field(i).IsZero() {
			t.Fatalf("the test entry leaves %s zero: set it so the round trip checks it", rv.Type().Field(i).Name)
		}
	}
	sparse := e
	sparse.Key[0] ^= 1
	sparse.Partition[0] ^= 1
	vectors := []vector.Vector{{Dense: []float32{0.5, -1, 3}}, {Indices: []uint32{1, 7, 1 << 31}, Values: []float32{1, 2, 0.25}}}
	x := NewEmbeddedIndex(4, 0)
	for i, en := range []Entry{e, sparse} {
		if err := x.Put(t.Context(), en, vectors[i], nil); err != nil {
			t.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := x.Save(&buf, DefaultSnapshotMaxBytes); err != nil {
		t.Fatal(err)
	}
	y := NewEmbeddedIndex(4, 0)
	if st, err := y.Load(&buf, DefaultSnapshotMaxBytes, epoch, "lexical-v1"); err != nil || st.Loaded != 2 {
		t.Fatalf("Load = (%+v, %v), want 2 loaded", st, err)
	}
	for i, en := range []Entry{e, sparse} {
		r, ok := y.byKey[en.Key]
		if !ok {
			t.Fatalf("entry %d missing", i)
		}
		n := y.nodes.at(r)
		if got := n.entry.entry(); !reflect.DeepEqual(got, en) {
			t.Errorf("entry %d = %+v, want %+v", i, got, en)
		}
		if !reflect.DeepEqual(y.vectorOf(n), vectors[i]) {
			t.Errorf("vector %d = %+v, want %+v", i, y.vectorOf(n), vectors[i])
		}
	}
}

// frame wraps body as one record with its checksum.
func frame(body []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
	b = append(b, body...)
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(body, castagnoli))
}

func snapshotOf(records ...[]byte) []byte {
	b := binary.BigEndian.AppendUint16([]byte(snapshotMagic), snapshotVersion)
	for _, r := range records {
		b = append(b, r...)
	}
	b = append(b, 0, 0, 0, 0)
	return binary.BigEndian.AppendUint64(b, uint64(len(records)))
}

// TestSnapshotRefusesHostileInput: each way a snapshot can lie or be damaged is refused with
// an error naming it, allocating far less than what the input claims.
func TestSnapshotRefusesHostileInput(t *testing.T) {
	good := appendRecord(nil, testEntry("a", "t", "s", "p", "alpha"), vector.Vector{Dense: []float32{1, 2}})
	// A record body that is good up to its vector, which then claims a length of its own.
	withVector := func(kind byte, n uint64, tail ...byte) []byte {
		b := appendRecord(nil, testEntry("a", "t", "s", "p", "alpha"), vector.Vector{})
		b = append(b[:len(b)-1], kind)
		b = binary.AppendUvarint(b, n)
		return append(b, tail...)
	}
	f32 := func(fs ...float32) []byte {
		var b []byte
		for _, f := range fs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
		}
		return b
	}
	whole := snapshotOf(frame(good))
	badSum := bytes.Clone(whole)
	badSum[20] ^= 1
	tests := []struct {
		name  string
		data  []byte
		max   int64
		want  string
		isErr error
	}{
		{"old gob format", oldFormatSnapshot(t), DefaultSnapshotMaxBytes, "format 1", ErrSnapshotOldFormat},
		{"not a snapshot", []byte("hello, this is not a snapshot at all"), DefaultSnapshotMaxBytes, "not a mantle cache snapshot", nil},
		{"other version", append([]byte(snapshotMagic), 0, 9), DefaultSnapshotMaxBytes, "version 9", nil},
		{"record over the record limit", snapshotOf([]byte{0xff, 0xff, 0xff, 0xf0}), DefaultSnapshotMaxBytes, "over the limit of", nil},
		{"record past the file limit", snapshotOf(binary.BigEndian.AppendUint32(nil, 60<<20)), 1 << 20, "larger than embedded.snapshot_max_bytes", ErrSnapshotTooLarge},
		{"record claiming more than is there", snapshotOf(append(binary.BigEndian.AppendUint32(nil, 60<<20), "abc"...))[:10+4+3], DefaultSnapshotMaxBytes, "truncated", nil},
		{"file past the limit", whole, int64(len(whole) - 1), "larger than embedded.snapshot_max_bytes", ErrSnapshotTooLarge},
		{"damaged byte", badSum, DefaultSnapshotMaxBytes, "checksum mismatch", nil},
		{"no end", whole[:len(whole)-12], DefaultSnapshotMaxBytes, "truncated", nil},
		{"end count wrong", append(bytes.Clone(whole[:len(whole)-1]), 7), DefaultSnapshotMaxBytes, "7 records announced, 1 read", nil},
		{"string longer than its record", snapshotOf(frame(binary.AppendUvarint(nil, 1<<40))), DefaultSnapshotMaxBytes, "id: 1099511627776 bytes, only 0 left", nil},
		{"dense vector longer than the limit", snapshotOf(frame(withVector(1, maxVectorLen+1))), DefaultSnapshotMaxBytes, "over the limit of 1048576", nil},
		{"dense vector longer than its record", snapshotOf(frame(withVector(1, 1000, f32(1)...))), DefaultSnapshotMaxBytes, "1000 coordinates, only 4 bytes left", nil},
		{"sparse indices out of order", snapshotOf(frame(withVector(2, 2, append(binary.LittleEndian.AppendUint32(f32(1), 5), append(binary.LittleEndian.AppendUint32(nil, 5), f32(1)...)...)...))), DefaultSnapshotMaxBytes, "not strictly increasing", nil},
		{"NaN coordinate", snapshotOf(frame(withVector(1, 2, f32(1, float32(math.NaN()))...))), DefaultSnapshotMaxBytes, "coordinate NaN", nil},
		{"unknown vector kind", snapshotOf(frame(withVector(7, 0))), DefaultSnapshotMaxBytes, "vector kind 7", nil},
		{"bytes after the vector", snapshotOf(frame(append(bytes.Clone(good), 0))), DefaultSnapshotMaxBytes, "1 bytes after the vector", nil},
		{"time too long", snapshotOf(frame(bytes.Replace(bytes.Clone(good), []byte{15, 1}, []byte{33, 1}, 1))), DefaultSnapshotMaxBytes, "created_at: 33 bytes, over the limit of 32", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			x := NewEmbeddedIndex(10, 0)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := x.Load(bytes.NewReader(tt.data), tt.max, epoch, "lexical-v1")
			runtime.ReadMemStats(&after)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Load error = %v, want one containing %q", err, tt.want)
			}
			if tt.isErr != nil && !errors.Is(err, tt.isErr) {
				t.Errorf("Load error = %v, want errors.Is %v", err, tt.isErr)
			}
			if got := after.TotalAlloc - before.TotalAlloc; got > 4<<20 {
				t.Errorf("Load of %d bytes allocated %d bytes", len(tt.data), got)
			}
		})
	}
	// The good record itself loads: the cases above differ from it only where they say.
	if st, err := NewEmbeddedIndex(10, 0).Load(bytes.NewReader(whole), DefaultSnapshotMaxBytes, epoch, "lexical-v1"); err != nil || st.Loaded != 1 {
		t.Fatalf("the good snapshot = (%+v, %v), want 1 loaded", st, err)
	}
}

// TestSnapshotSaveWithinLimit: a snapshot that would pass its limit keeps the most recently
// used entries that fit, and reads back under the same limit.
func TestSnapshotSaveWithinLimit(t *testing.T) {
	t.Parallel()
	x := NewEmbeddedIndex(100, 0)
	var ids []string
	for i := range 50 {
		e := testEntry(string(rune('A'+i)), "t", "s", "p", strings.Repeat("word ", 10)+string(rune('A'+i)))
		e.Content = strings.Repeat("x", 1000)
		put(t, x, e)
		ids = append(ids, e.ID)
	}
	const limit = 20 << 10
	var buf bytes.Buffer
	st, err := x.Save(&buf, limit)
	if err != nil {
		t.Fatal(err)
	}
	if st.Dropped == 0 || st.Written == 0 || st.Written+st.Dropped != 50 || int64(buf.Len()) > limit || st.Bytes != int64(buf.Len()) {
		t.Fatalf("Save = %+v (%d bytes), want some written and some left out within %d bytes", st, buf.Len(), limit)
	}
	y := NewEmbeddedIndex(100, 0)
	if ld, err := y.Load(&buf, limit, epoch, "lexical-v1"); err != nil || ld.Loaded != st.Written {
		t.Fatalf("Load = (%+v, %v), want %d loaded", ld, err, st.Written)
	}
	// The last ones put are the most recently used, and are the ones kept.
	for _, r := range y.byKey {
		id := y.nodes.at(r).entry.field(textID)
		if i := strings.Index(strings.Join(ids, ""), id); i < 50-st.Written {
			t.Errorf("kept %q, an older entry, over a newer one", id)
		}
	}
}

// TestSnapshotFileOverLimitNotRead: LoadFile refuses a file larger than its limit from its
// size alone.
func TestSnapshotFileOverLimitNotRead(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "cache.snap")
	if err := os.WriteFile(path, make([]byte, 2<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := NewEmbeddedIndex(10, 0).LoadFile(path, 1<<20, epoch, "lexical-v1")
	if !errors.Is(err, ErrSnapshotTooLarge) || !strings.Contains(err.Error(), "2097152 bytes, limit 1048576") {
		t.Errorf("LoadFile error = %v, want ErrSnapshotTooLarge with both sizes", err)
	}
}

// TestSnapshotSeedsInFuzzCorpus: the committed seeds of FuzzSnapshotLoad include a valid
// snapshot of the current format, so the fuzzer starts from inputs that get past the header.
func TestSnapshotSeedsInFuzzCorpus(t *testing.T) {
	t.Parallel()
	seeds := snapshotSeeds(t)
	if st, err := NewEmbeddedIndex(10, 0).Load(bytes.NewReader(seeds[0]), fuzzSnapshotMaxBytes, epoch, "lexical-v1"); err != nil || st.Loaded != 6 {
		t.Fatalf("first seed = (%+v, %v), want 6 loaded", st, err)
	}
}
