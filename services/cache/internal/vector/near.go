package vector

// Near is what a search through a set's graph found near its query on the bottom layer: the
// nodes its walk ended on, best first, with their exact similarity to the query. Linking a
// vector into the graph is a walk of that kind for the vector (with EfConstruction
// candidates), so when the vector searched for is then stored, as a cache stores the answer
// to the question it has just looked up, the lookup's walk can stand in for the linking's:
// AddNear takes it, and the vector's links are chosen from it.
//
// A search whose postings sufficed does not walk; it records the seeds it scored instead:
// the vectors that share the query's rarest coordinates, each scored exactly, the nearest
// the postings know of. The links are chosen from them as from a walk's result
// (docs/design/013-link-from-the-postings.md).
//
// A Near stays usable while the set's graph does: a node whose slot has since taken
// another vector is dropped from it (each node's generation is recorded), and a Near of a
// graph that was dropped or rebuilt is ignored. The graph may have gained nodes meanwhile
// that the walk could not see; they link to the new vector when they are linked
// themselves, as they would to any older one. (docs/design/007-link-from-the-lookup.md)
type Near struct {
	g    *graph
	hits []Hit
	gens []uint32
}

func (n *Near) reset() {
	n.g, n.hits, n.gens = nil, n.hits[:0], n.gens[:0]
}

// record keeps hits (a walk's result on g, or the seeds a postings search scored).
func (n *Near) record(g *graph, hits []Hit) {
	n.g = g
	n.hits = append(n.hits[:0], hits...)
	n.gens = n.gens[:0]
	for _, h := range hits {
		n.gens = append(n.gens, g.gen[h.Slot])
	}
}

// candidates returns the recorded nodes that still hold the vector they held when the walk
// scored them, other than slot itself, best first.
func (n *Near) candidates(slot uint32) []Hit {
	out := make([]Hit, 0, len(n.hits))
	for i, h := range n.hits {
		if h.Slot != slot && n.g.gen[h.Slot] == n.gens[i] {
			out = append(out, h)
		}
	}
	return out
}
