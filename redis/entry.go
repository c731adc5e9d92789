package flightredis

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/flightcache/flightcache/redis/internal/wake"
)

// Codec turns values into bytes for Redis and back. Implementations must be
// safe for concurrent use. The zero Options use [JSON].
type Codec[V any] interface {
	// Marshal encodes v.
	Marshal(v V) ([]byte, error)
	// Unmarshal decodes data, as written by Marshal (possibly by another
	// process, possibly by another version of the program).
	Unmarshal(data []byte) (V, error)
}

// JSON is the default [Codec]: encoding/json. Its zero value is ready to use
// and safe for concurrent use.
type JSON[V any] struct{}

// Marshal encodes v with json.Marshal.
func (JSON[V]) Marshal(v V) ([]byte, error) { return json.Marshal(v) }

// Unmarshal decodes data with json.Unmarshal.
func (JSON[V]) Unmarshal(data []byte) (V, error) {
	var v V
	err := json.Unmarshal(data, &v)
	return v, err
}

// keys are the Redis names of one key's state in one generation of the
// shared tier (generation.go). They share a hash tag, so they live in one
// Redis Cluster hash slot and one Lua script may touch them all.
type keys struct {
	gen   int64  // the generation they belong to
	base  string // the hash-tagged name
	wake  string // the key's wake-up channel (package wake): base + ":w", of the key's hash slot
	entry string // hash: the shared entry (fields below)
	lease string // string: the token of the process loading the key
	alive string // string: the same token while its holder proves it is alive
	fail  string // string: "token\nkind\nmessage" of a load that just failed
}

// keysFor names the state of the key whose string form is k in generation
// 0, the one a fleet starts in (and the only one of versions that predate
// generations).
func keysFor(prefix, k string) keys { return keysAt(prefix, k, 0) }

// keyEscaper and keyUnescaper escape a key's name into its hash tag and
// back (keysAt, tracked.go). A Replacer is safe for concurrent use and
// costly to build, so each is built once.
var (
	keyEscaper   = strings.NewReplacer("%", "%25", "}", "%7D")
	keyUnescaper = strings.NewReplacer("%7D", "}", "%25", "%")
)

// keysAt names the state of the key whose string form is k in generation
// gen: "<prefix>{<tag>}:<suffix>" in generation 0, and
// "<prefix>{<tag>}:g<gen>:<suffix>" after. The hash tag is k itself,
// escaped so that the tag never ends early and never is empty (Redis
// hashes a whole name whose tag is empty, which would scatter one key's
// state over several Cluster items). The escaping is injective, and the
// tag ends at the first '}', so names of different keys or generations
// never meet. A key keeps its hash slot in every generation.
func keysAt(prefix, k string, gen int64) keys {
	tag := "%" // the empty key: "%" alone is never the escape of another key
	if k != "" {
		tag = keyEscaper.Replace(k)
	}
	base := prefix + "{" + tag + "}"
	if gen != 0 {
		base += ":g" + strconv.FormatInt(gen, 10)
	}
	return keys{gen: gen, base: base, wake: wake.Channel(base), entry: base + ":v", lease: base + ":l", alive: base + ":a", fail: base + ":f"}
}

// entry is the shared entry of one key, as stored in a Redis hash. Times are
// Unix microseconds on the clock of the process that wrote the entry, so
// that Lua (whose numbers are doubles) can hold them exactly.
type entry struct {
	ok    bool   // the hash exists
	id    string // version: random per write, compared to detect a change
	val   []byte // the value, encoded by the Codec
	at    int64  // loaded at
	took  int64  // how long the load took
	fresh int64  // fresh until
	stale int64  // served stale until (the end of StaleWhileRevalidate)
	until int64  // may cover a failed load until (the end of StaleIfError); -1: not stored (an older writer)
	nf    bool   // a shared not-found marker: no value; fresh is when it ends (see notFoundScript)

	tags     []string // the value's tags (Options.Tags, tags.go); none for an untagged value
	tagStamp int64    // the tag clock the value was stored with
}

// entryFields are the hash fields read back, in this order. "until" and
// "nf" came last and may be missing from an entry an older version wrote.
// A not-found marker has only "id", "nf" ("1"), "at" and "fresh": with no
// "v", an older version's parseEntry reports it as an entry that does not
// parse, which that version replaces under the lease, never serves.
var entryFields = []string{"id", "v", "at", "took", "fresh", "stale", "until", "nf", tagField}

// untilField and nfField are the indexes of "until" and "nf" in entryFields.
const (
	untilField = 6
	nfField    = 7
	tagsField  = 8 // "tg" (tags.go): the value's tags and stamp, absent for an untagged value
)

// parseEntry reads the reply of HMGET entryFields (or the same list returned
// by a script). A missing hash gives ok == false; a hash with a field that
// does not parse is reported as an error, and treated by callers as
// missing.
func parseEntry(vals []any) (entry, error) {
	if len(vals) < untilField || vals[0] == nil {
		return entry{}, nil
	}
	// On error the entry keeps its id, so the caller can replace this
	// version under the lease instead of reading it again and again.
	id, _ := vals[0].(string)
	if len(vals) > nfField && vals[nfField] == "1" {
		return parseNotFound(id, vals)
	}
	vals0 := vals
	until := int64(-1)
	if len(vals) > untilField && vals[untilField] != nil {
		u, ok := vals[untilField].(string)
		n, err := strconv.ParseInt(u, 10, 64)
		if ok && err == nil {
			until = n
		}
	}
	vals = vals[:untilField]
	s := make([]string, len(vals))
	for i := range vals {
		v, ok := vals[i].(string)
		if !ok {
			return entry{id: id}, fmt.Errorf("flightredis: entry field %v is %T", entryFields[i], vals[i])
		}
		s[i] = v
	}
	e := entry{ok: true, id: id, val: []byte(s[1]), until: until}
	if len(vals0) > tagsField && vals0[tagsField] != nil {
		tg, _ := vals0[tagsField].(string)
		var ok bool
		if e.tagStamp, e.tags, ok = parseTags(tg); !ok {
			return entry{id: id}, fmt.Errorf("flightredis: entry field %s: %q does not parse", tagField, tg)
		}
	}
	for i, p := range []*int64{&e.at, &e.took, &e.fresh, &e.stale} {
		n, err := strconv.ParseInt(s[i+2], 10, 64)
		if err != nil {
			return entry{id: id}, fmt.Errorf("flightredis: entry field %s: %w", entryFields[i+2], err)
		}
		*p = n
	}
	return e, nil
}

// parseNotFound reads a not-found marker (see parseEntry): its "at" and
// "fresh" (the end of NotFoundTTL on the writer's clock).
func parseNotFound(id string, vals []any) (entry, error) {
	e := entry{ok: true, id: id, nf: true, until: -1}
	for i, p := range map[int]*int64{2: &e.at, 4: &e.fresh} {
		s, _ := vals[i].(string)
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return entry{id: id}, fmt.Errorf("flightredis: not-found marker field %s: %w", entryFields[i], err)
		}
		*p = n
	}
	return e, nil
}

// micros converts between time.Time and the entry's Unix microseconds.
func micros(t time.Time) int64 { return t.UnixMicro() }

func fromMicros(us int64) time.Time { return time.UnixMicro(us) }

// token returns a random hex string of n bytes.
func token(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}

// keyString is the default Options.Key: a string as is, anything else
// through fmt.Sprint.
func keyString[K comparable](k K) string {
	if s, ok := any(k).(string); ok {
		return s
	}
	return fmt.Sprint(k)
}
