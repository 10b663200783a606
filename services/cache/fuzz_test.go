package cache

import (
	"bytes"
	"testing"
	"time"
)

// fuzzSnapshotMaxBytes is the size limit the fuzzer loads under: small, so that a record
// claiming more than the limit is refused as it would be in production, and so that each
// execution stays cheap.
const fuzzSnapshotMaxBytes = 64 << 10

// FuzzSnapshotLoad: a damaged or hostile snapshot file is loaded in part or refused with an
// error, never a panic, never past the index's max_entries, and never with more memory than
// the bytes it read; whatever loads is a consistent index that answers lookups and saves
// and loads again to the same entries.
func FuzzSnapshotLoad(f *testing.F) {
	now := epoch.Add(time.Minute)
	for _, seed := range snapshotSeeds(f) {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		x := NewEmbeddedIndex(4, 0)
		stats, err := x.Load(bytes.NewReader(data), fuzzSnapshotMaxBytes, now, "lexical-v1")
		if err != nil {
			return
		}
		if stats.Loaded > 4 || x.Len() != stats.Loaded {
			t.Fatalf("loaded %d entries (Len %d) into an index of 4", stats.Loaded, x.Len())
		}
		var again bytes.Buffer
		saved, err := x.Save(&again, fuzzSnapshotMaxBytes)
		if err != nil || saved.Written != stats.Loaded {
			t.Fatalf("Save after Load = (%+v, %v), want %d written", saved, err, stats.Loaded)
		}
		y := NewEmbeddedIndex(4, 0)
		if st, err := y.Load(&again, fuzzSnapshotMaxBytes, now, "lexical-v1"); err != nil || st.Loaded != stats.Loaded {
			t.Fatalf("reload = (%+v, %v), want %d loaded", st, err, stats.Loaded)
		}
		for _, r := range x.byKey {
			n := x.nodes.at(r)
			e := n.entry.entry()
			if got, ok, err := y.Get(t.Context(), e.Namespace, e.Key, now); !ok || err != nil || got.ID != e.ID || got.Content != e.Content || got.Tenant != e.Tenant {
				t.Fatalf("entry %q lost or changed by a save and load: %+v, want %+v", e.ID, got, e)
			}
			if x.vectorOf(n).Len() > 0 {
				if _, err := y.Search(t.Context(), Query{Tenant: e.Tenant, Partition: e.Partition, Vector: x.vectorOf(n), Limit: 2, Now: now}); err != nil {
					t.Fatalf("search: %v", err)
				}
			}
		}
	})
}

// snapshotSeeds are the committed starting points: a good snapshot, its halves and single
// damaged bytes, and the other inputs the decoder must refuse.
func snapshotSeeds(t testing.TB) [][]byte {
	x := NewEmbeddedIndex(10, 0)
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		put(t, x, testEntry(id, "t", "s", "p", id+" question about breakers"))
	}
	var good bytes.Buffer
	if _, err := x.Save(&good, fuzzSnapshotMaxBytes); err != nil {
		t.Fatal(err)
	}
	g := good.Bytes()
	flipped := bytes.Clone(g)
	flipped[len(flipped)/3] ^= 0x40
	return [][]byte{g, g[:len(g)/2], flipped, []byte("not a snapshot"), {}, oldFormatSnapshot(t)}
}
