package cache

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/mantle-mesh/mantle/services/cache/internal/vector"

	"pgregory.net/rapid"
)

// TestRecencyList: any sequence of pushes, moves and removals leaves the list in the order
// a plain slice keeps, read from either end, and a released place is reused cleared.
func TestRecencyList(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(t *rapid.T) {
		var (
			table nodeTable
			list  recencyList
			model []nodeRef // front first
		)
		for i := range rapid.IntRange(1, 3*nodeChunk).Draw(t, "ops") {
			op := rapid.IntRange(0, 3).Draw(t, "op")
			if len(model) == 0 || len(model) < 2*nodeChunk && op < 2 {
				// Over a chunk's worth at times, so that a second chunk is used.
				r := table.add(node{size: int64(i)})
				if got := table.at(r); got.size != int64(i) || got.prev != 0 || got.next != 0 {
					t.Fatalf("add(%d) = %d holding %+v", i, r, *got)
				}
				if op == 0 {
					list.pushFront(&table, r)
					model = slices.Insert(model, 0, r)
				} else {
					list.pushBack(&table, r)
					model = append(model, r)
				}
				continue
			}
			k := rapid.IntRange(0, len(model)-1).Draw(t, "which")
			r := model[k]
			model = slices.Delete(model, k, k+1)
			if op == 2 {
				list.moveToFront(&table, r)
				model = slices.Insert(model, 0, r)
				continue
			}
			list.remove(&table, r)
			table.release(r)
			if got := *table.at(r); !reflect.DeepEqual(got, node{}) {
				t.Fatalf("released %d still holds %+v", r, got)
			}
		}
		var forward, backward []nodeRef
		for r := list.front; r != 0; r = table.at(r).next {
			forward = append(forward, r)
		}
		for r := list.back; r != 0; r = table.at(r).prev {
			backward = slices.Insert(backward, 0, r)
		}
		if !slices.Equal(forward, model) || !slices.Equal(backward, model) {
			t.Fatalf("front to back %v, back to front %v; want %v", forward, backward, model)
		}
		if table.used > len(model)+len(table.free) {
			t.Fatalf("%d places used for %d nodes and %d free: released places not reused", table.used, len(model), len(table.free))
		}
	})
}

// TestEmbeddedIndexAgainstModel: under any sequence of stores, reads, touches and deletes
// across two tenants and two partitions each, the index holds what a plain map and recency
// slice hold (evicting the least recently used past its bound), its key map, slot maps and
// recency list agree with one another, and a search finds only its own tenant's entries.
func TestEmbeddedIndexAgainstModel(t *testing.T) {
	t.Parallel()
	questions := []string{"how do refunds work", "reset my password please", "shipping to canada",
		"cancel the order", "change the delivery address", "refund a gift card"}
	vectors := make(map[string]vector.Vector)
	for _, q := range questions {
		vectors[q] = vec(t, q)
	}
	rapid.Check(t, func(t *rapid.T) {
		const maxEntries = 5
		x := NewEmbeddedIndex(maxEntries, 0)
		ctx := context.Background()
		var model []Entry // most recently used first
		find := func(key Key) int {
			return slices.IndexFunc(model, func(e Entry) bool { return e.Key == key })
		}
		draw := func() Entry {
			tenant := rapid.SampledFrom([]string{"acme", "globex"}).Draw(t, "tenant")
			part := rapid.SampledFrom([]string{"p", "q"}).Draw(t, "partition")
			question := rapid.SampledFrom(questions).Draw(t, "question")
			return testEntry(fmt.Sprint(rapid.IntRange(0, 999).Draw(t, "id")), tenant, "s", part, question)
		}
		for range rapid.IntRange(1, 60).Draw(t, "ops") {
			e := draw()
			switch rapid.IntRange(0, 4).Draw(t, "op") {
			case 0, 1: // store
				if err := x.Put(ctx, e, vectors[e.Question], nil); err != nil {
					t.Fatalf("Put: %v", err)
				}
				if i := find(e.Key); i >= 0 {
					model = slices.Delete(model, i, i+1)
				}
				model = slices.Insert(model, 0, e)
				model = model[:min(len(model), maxEntries)]
			case 2: // read
				got, ok, err := x.Get(ctx, e.Namespace, e.Key, epoch)
				i := find(e.Key)
				if err != nil || ok != (i >= 0) || ok && got.ID != model[i].ID {
					t.Fatalf("Get(%s) = (%s, %v, %v), model holds it at %d", e.Question, got.ID, ok, err, i)
				}
				if ok {
					model = slices.Insert(slices.Delete(model, i, i+1), 0, got)
				}
			case 3: // similarity hit
				x.Touch(e.Key)
				if i := find(e.Key); i >= 0 {
					m := model[i]
					model = slices.Insert(slices.Delete(model, i, i+1), 0, m)
				}
			case 4: // invalidate a tenant's entries
				n, err := x.Delete(ctx, Filter{Tenant: e.Tenant})
				kept := slices.DeleteFunc(slices.Clone(model), func(m Entry) bool { return m.Tenant == e.Tenant })
				if err != nil || n != len(model)-len(kept) {
					t.Fatalf("Delete(%s) = (%d, %v), want %d", e.Tenant, n, err, len(model)-len(kept))
				}
				model = kept
			}
			checkEmbeddedIndex(t, x, model)
			hits, err := x.Search(ctx, Query{Tenant: e.Tenant, Partition: e.Partition, Vector: vectors[e.Question], Limit: maxEntries, Now: epoch})
			if err != nil {
				t.Fatalf("Search: %v", err)
			}
			for _, h := range hits {
				if i := find(h.Entry.Key); h.Entry.Tenant != e.Tenant || h.Entry.Partition != e.Partition || i < 0 || model[i].ID != h.Entry.ID {
					t.Fatalf("search of %s/%x found %+v", e.Tenant, e.Partition[:4], h.Entry)
				}
			}
			if i := find(e.Key); i >= 0 && !slices.ContainsFunc(hits, func(h Candidate) bool { return h.Entry.Key == e.Key }) {
				t.Fatalf("search for a held entry's own question did not find it: %v", hits)
			}
		}
	})
}

// checkEmbeddedIndex fails t unless x holds the entries of model in its recency order,
// every key and slot naming the node that holds it.
func checkEmbeddedIndex(t *rapid.T, x *EmbeddedIndex, model []Entry) {
	x.lockRead()
	defer x.unlockRead()
	var order []string
	for r := x.recency.front; r != 0; r = x.nodes.at(r).next {
		n := x.nodes.at(r)
		order = append(order, n.entry.field(textID)+"/"+n.entry.field(textQuestion))
		if x.byKey[n.entry.key] != r {
			t.Fatalf("node %d (%s) is not under its key", r, n.entry.field(textID))
		}
		p := x.parts[n.entry.partition]
		if p == nil || !n.inSet || int(n.slot) >= len(p.bySlot) || p.bySlot[n.slot] != r {
			t.Fatalf("node %d (%s) is not in its partition's slot", r, n.entry.field(textID))
		}
	}
	want := make([]string, 0, len(model))
	for _, e := range model {
		want = append(want, e.ID+"/"+e.Question)
	}
	if !slices.Equal(order, want) || len(x.byKey) != len(model) {
		t.Fatalf("index holds %v (%d keys), want %v", order, len(x.byKey), want)
	}
	nodes := 0
	for key, p := range x.parts {
		for slot, r := range p.bySlot {
			if r != 0 && (x.nodes.at(r).entry.partition != key || x.nodes.at(r).slot != uint32(slot)) {
				t.Fatalf("slot %d of a partition names node %d, which is elsewhere", slot, r)
			}
		}
		nodes += p.nodes
	}
	if nodes != len(model) {
		t.Fatalf("partitions count %d nodes, want %d", nodes, len(model))
	}
}
