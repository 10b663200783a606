package redisstore

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The quota operations share prelude.lua (arithmetic, clock, bucket helpers); batch.lua
// runs a list of them in one call.
var (
	//go:embed lua/prelude.lua
	luaPrelude string
	//go:embed lua/reserve.lua
	luaReserve string
	//go:embed lua/settle.lua
	luaSettle string
	//go:embed lua/adjust.lua
	luaAdjust string
	//go:embed lua/retry.lua
	luaRetry string
	//go:embed lua/batch.lua
	luaBatch string
)

// Operation names of batch.lua.
const (
	opReserve = "r"
	opSettle  = "s"
	opAdjust  = "a"
	opRetry   = "t"
)

// luaLib is the quota code in the two forms Redis runs it: a function library (Redis
// 7.0 and later), whose helpers are built once when it is loaded, and a script, which
// rebuilds them on every EVALSHA, for servers without functions.
//
// The library's name carries a hash of its code, which versions it: replicas running
// different builds (a rolling deploy) each load and call their own library, and REPLACE
// only ever replaces a library with the same code.
type luaLib struct {
	name   string // library and function name
	code   string // FUNCTION LOAD's argument
	script *redis.Script
	src    string // the script's body, for EVAL
}

// quotaLib is the library every Store uses.
var quotaLib = newLuaLib("")

// newLuaLib assembles the library; extra is Lua code added to it (tests use a comment
// to get a library no Redis has seen yet).
func newLuaLib(extra string) *luaLib {
	var b strings.Builder
	b.WriteString(extra)
	b.WriteString("\n")
	b.WriteString(luaPrelude)
	for _, op := range []struct{ name, body string }{
		{"op_reserve", luaReserve}, {"op_settle", luaSettle}, {"op_adjust", luaAdjust}, {"op_retry", luaRetry},
	} {
		// Each operation file is the body of a function of its keys (K2 is nil for
		// operations of one key) and its arguments.
		b.WriteString("\nlocal function " + op.name + "(K1, K2, ARGV)\n")
		b.WriteString(op.body)
		b.WriteString("\nend\n")
	}
	b.WriteString(luaBatch)
	body := b.String()
	sum := sha1.Sum([]byte(body))
	name := "mantle_quota_" + hex.EncodeToString(sum[:8])
	src := body + "\nreturn batch(KEYS, ARGV)\n"
	return &luaLib{
		name:   name,
		code:   "#!lua name=" + name + "\n" + body + "\nredis.register_function('" + name + "', batch)\n",
		script: redis.NewScript(src),
		src:    src,
	}
}

// command is the FCALL (or EVALSHA, or EVAL) that runs calls in order, in batch.lua's
// layout: every call's keys, then one MessagePack array of per call its operation, key
// count and arguments (already encoded, see msgpack.go).
func (l *luaLib) command(mode sendMode, calls []*scriptCall) []any {
	nkeys, size := 0, 5
	for _, c := range calls {
		nkeys += len(c.keys)
		size += 2 + len(c.op) + 1 + len(c.args)
	}
	a := make([]any, 0, 4+nkeys)
	switch mode {
	case sendFunction:
		a = append(a, "fcall", l.name)
	case sendScript:
		a = append(a, "evalsha", l.script.Hash())
	default:
		a = append(a, "eval", l.src)
	}
	a = append(a, nkeys)
	for _, c := range calls {
		for _, k := range c.keys {
			a = append(a, k)
		}
	}
	list := mpArray(make([]byte, 0, size), 3*len(calls))
	for _, c := range calls {
		list = appendOp(list, c)
	}
	return append(a, list)
}

// appendOp appends one call's entry of batch.lua's operation list.
func appendOp(b []byte, c *scriptCall) []byte {
	b = mpString(b, c.op)
	b = mpInt(b, int64(len(c.keys)))
	return append(b, c.args...)
}

// opList is the operation list of one call on its own, for a Scripter.
func opList(c *scriptCall) []byte {
	return appendOp(mpArray(make([]byte, 0, 8+len(c.args)), 3), c)
}
