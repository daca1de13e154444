package server

import (
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/clusterd/clusterd/service"
)

// requestCodec is gRPC's proto codec with two changes. A request that does
// not decode (a string field that is not UTF-8, broken wire data) is not
// answered by gRPC itself with INTERNAL, which is what gRPC does with any
// decoding error before an interceptor runs. The codec leaves the message
// empty and keeps the error for the interceptor chain (take), which answers
// INVALID_ARGUMENT naming the field, after authentication. And a response
// is encoded into a buffer from a pool of every power of two from 2 KiB to
// 1 MiB (see Marshal).
type requestCodec struct {
	encoding.CodecV2
	mu     sync.Mutex
	failed map[any]error
	// pool holds the buffers Marshal encodes responses into; gRPC's
	// transport puts each back once it has written it.
	pool mem.BufferPool
}

func newRequestCodec() *requestCodec {
	// 2 KiB to 1 MiB: a response of 1 KiB or less is not pooled (gRPC's
	// threshold), one larger than 1 MiB comes from the pool's fallback.
	pool, err := mem.NewBinaryTieredBufferPool(11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
	if err != nil {
		panic(fmt.Sprintf("response buffer pool: %v", err)) // only for exponents too large for the platform
	}
	return &requestCodec{CodecV2: encoding.GetCodecV2("proto"), failed: map[any]error{}, pool: pool}
}

// Marshal encodes like gRPC's codec, into a buffer from c.pool. gRPC's
// default pool has no size between 32 KiB and 1 MiB and clears a buffer's
// whole capacity when it hands it out, so every response of that size (a
// page of ListClusters: tens of KiB) cleared 1 MiB: 7% of clusterd's CPU in a
// page of 100 clusters. Up to 1 MiB, a buffer from c.pool is at most twice
// the response.
func (c *requestCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return c.CodecV2.Marshal(v)
	}
	size := proto.Size(m)
	// UseCachedSize reuses the sizes proto.Size just computed, as gRPC's
	// codec does.
	opts := proto.MarshalOptions{UseCachedSize: true}
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := opts.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := c.pool.Get(size)
	if _, err := opts.MarshalAppend((*buf)[:0], m); err != nil {
		c.pool.Put(buf)
		return nil, err
	}
	return mem.BufferSlice{mem.NewBuffer(buf, c.pool)}, nil
}

// Unmarshal decodes like gRPC's codec, keeping a decoding error for take.
func (c *requestCodec) Unmarshal(data mem.BufferSlice, v any) error {
	err := c.CodecV2.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return err
	}
	proto.Reset(m)
	field := invalidUTF8Field(m.ProtoReflect().Descriptor(), data.Materialize(), "")
	bad := &service.InvalidArgumentError{Violations: []service.FieldViolation{{Field: field, Description: "is not valid UTF-8"}}}
	if field == "" {
		bad.Violations[0] = service.FieldViolation{Field: "request", Description: fmt.Sprintf("cannot be decoded: %v", err)}
	}
	c.mu.Lock()
	c.failed[v] = bad
	c.mu.Unlock()
	return nil
}

// take returns (and forgets) the decoding error of request v, if any.
func (c *requestCodec) take(v any) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	err, ok := c.failed[v]
	if ok {
		delete(c.failed, v)
	}
	return err
}

// invalidUTF8Field walks wire data of a message of type md and returns the
// path of the first string field that is not UTF-8 ("cluster.display_name",
// "remove_nodes[1]"), or "" if none is.
func invalidUTF8Field(md protoreflect.MessageDescriptor, b []byte, prefix string) string {
	seen := map[protowire.Number]int{}
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return ""
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return ""
		}
		b = b[n:]
		fd := md.Fields().ByNumber(num)
		if fd == nil || fd.IsMap() {
			continue
		}
		name := prefix + string(fd.Name())
		if fd.IsList() {
			name = fmt.Sprintf("%s[%d]", name, seen[num])
			seen[num]++
		}
		switch fd.Kind() {
		case protoreflect.StringKind:
			if !utf8.Valid(v) {
				return name
			}
		case protoreflect.MessageKind:
			if p := invalidUTF8Field(fd.Message(), v, name+"."); p != "" {
				return p
			}
		}
	}
	return ""
}
