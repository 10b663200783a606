package cache

import (
	"bytes"
	"testing"
	"time"
)

// FuzzSnapshotLoad: a damaged or hostile snapshot file is loaded in part or refused with an
// error, never a panic, and never past the index's max_entries.
func FuzzSnapshotLoad(f *testing.F) {
	now := epoch.Add(time.Minute)
	var good bytes.Buffer
	x := NewEmbeddedIndex(10)
	for _, id := range []string{"a", "b", "c", "d", "e", "f"} {
		put(f, x, testEntry(id, "t", "s", "p", id+" question about breakers"))
	}
	if err := x.Save(&good); err != nil {
		f.Fatal(err)
	}
	f.Add(good.Bytes())
	f.Add(good.Bytes()[:len(good.Bytes())/2])
	f.Add([]byte("not a snapshot"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		x := NewEmbeddedIndex(4)
		stats, err := x.Load(bytes.NewReader(data), now, "lexical-v1")
		if err == nil && stats.Loaded > 4 {
			t.Fatalf("loaded %d entries into an index of 4", stats.Loaded)
		}
	})
}
