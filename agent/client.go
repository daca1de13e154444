package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"
)

// Client sends requests to one agent over one connection. Calls are
// serialized. A call abandoned by its context leaves its response on the
// stream; the next call skips it by id, so the connection stays usable.
type Client struct {
	mu     sync.Mutex
	rw     io.ReadWriter
	r      *bufio.Reader
	nextID uint64
	// partial is set when a read stopped in the middle of a line; the next
	// call drops the rest of that line first.
	partial bool
}

// deadliner is what net.Conn (and os.File on a pollable fd) offer to bound
// a blocking read or write; the client uses it to honour ctx.
type deadliner interface {
	SetDeadline(t time.Time) error
}

// NewClient returns a client talking over rw. Request ids start at a
// random number, so a response the agent still owed a previous connection
// on the same channel cannot be taken for one of this client's.
func NewClient(rw io.ReadWriter) *Client {
	return &Client{rw: rw, r: bufio.NewReader(rw), nextID: rand.Uint64N(1<<52) + 1}
}

// Do sends req (its ID is set by the client) and returns the agent's
// response. A response with ok false is returned together with an *Error.
// When rw has SetDeadline, ctx bounds the call; otherwise only the agent's
// answer or the stream's end does.
func (c *Client) Do(ctx context.Context, req Request) (Response, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return Response{}, fmt.Errorf("agent %s: %w", req.Op, err)
	}
	if d, ok := c.rw.(deadliner); ok {
		deadline, _ := ctx.Deadline()
		if err := d.SetDeadline(deadline); err != nil {
			return Response{}, fmt.Errorf("agent %s: set deadline: %w", req.Op, err)
		}
		expired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			d.SetDeadline(time.Unix(1, 0))
			close(expired)
		})
		defer func() {
			if !stop() {
				// Let it finish, so it cannot expire the next call.
				<-expired
			}
		}()
	}
	resp, err := c.roundTrip(req)
	if err != nil {
		if dl, ok := ctx.Deadline(); ok && errors.Is(err, os.ErrDeadlineExceeded) && !time.Now().Before(dl) {
			// The stream's deadline is ctx's: its timer fires at once.
			<-ctx.Done()
		}
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return Response{}, fmt.Errorf("agent %s: %w", req.Op, err)
	}
	if !resp.OK {
		return resp, &Error{Op: req.Op, Message: resp.Error}
	}
	return resp, nil
}

func (c *Client) roundTrip(req Request) (Response, error) {
	req.ID = c.nextID
	c.nextID++
	line, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("encode: %w", err)
	}
	if _, err := c.rw.Write(append(line, '\n')); err != nil {
		return Response{}, fmt.Errorf("send: %w", err)
	}
	if c.partial {
		if _, err := c.r.ReadBytes('\n'); err != nil {
			return Response{}, fmt.Errorf("receive: %w", err)
		}
		c.partial = false
	}
	for {
		line, err := c.r.ReadBytes('\n')
		if err != nil {
			c.partial = len(line) > 0
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Response{}, fmt.Errorf("receive: %w", err)
		}
		var resp Response
		if err := json.Unmarshal(line, &resp); err != nil {
			return Response{}, fmt.Errorf("decode %q: %w", line, err)
		}
		if resp.ID == req.ID {
			return resp, nil
		}
		// A response to an earlier, abandoned call (or to a line the agent
		// could not read, id 0): not ours.
	}
}

// Status returns the node's status; it changes nothing.
func (c *Client) Status(ctx context.Context) (Status, error) {
	resp, err := c.Do(ctx, Request{Op: OpStatus})
	return resp.Status, err
}

// Join installs version from the attached ISO (unless installed) and joins
// cluster.
func (c *Client) Join(ctx context.Context, cluster, version string) (Status, error) {
	resp, err := c.Do(ctx, Request{Op: OpJoin, Cluster: cluster, Version: version})
	return resp.Status, err
}

// Upgrade installs version from the attached ISO (unless installed) and
// uncordons the node.
func (c *Client) Upgrade(ctx context.Context, version string) (Status, error) {
	resp, err := c.Do(ctx, Request{Op: OpUpgrade, Version: version})
	return resp.Status, err
}

// Drain cordons the node.
func (c *Client) Drain(ctx context.Context) (Status, error) {
	resp, err := c.Do(ctx, Request{Op: OpDrain})
	return resp.Status, err
}

// Uncordon lets work back onto the node.
func (c *Client) Uncordon(ctx context.Context) (Status, error) {
	resp, err := c.Do(ctx, Request{Op: OpUncordon})
	return resp.Status, err
}

// Leave makes the node forget its cluster.
func (c *Client) Leave(ctx context.Context) (Status, error) {
	resp, err := c.Do(ctx, Request{Op: OpLeave})
	return resp.Status, err
}

// Kubeconfig returns the admin kubeconfig of the node's cluster.
func (c *Client) Kubeconfig(ctx context.Context) (string, error) {
	resp, err := c.Do(ctx, Request{Op: OpKubeconfig})
	return resp.Kubeconfig, err
}

// Deploy records add-on name (AddonProvider or AddonAutoscaler) as deployed.
func (c *Client) Deploy(ctx context.Context, name string) (Status, error) {
	resp, err := c.Do(ctx, Request{Op: OpDeploy, Name: name})
	return resp.Status, err
}
