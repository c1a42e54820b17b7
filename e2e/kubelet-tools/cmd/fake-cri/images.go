package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// imageSize is what every image reports. The kubelet's image manager rejects a pulled image
// whose size is 0.
const imageSize = 1 << 20

type image struct {
	id      string   // "sha256:<hex>"
	tags    []string // normalized references, e.g. docker.io/library/busybox:latest
	digests []string // repo@sha256:<hex>
}

// name is what a container status reports as its image: the first tag, else the first digest.
func (i *image) name() string {
	if len(i.tags) > 0 {
		return i.tags[0]
	}
	if len(i.digests) > 0 {
		return i.digests[0]
	}
	return i.id
}

// ref is the image reference a container status reports (a repo digest, as containerd does).
func (i *image) ref() string {
	if len(i.digests) > 0 {
		return i.digests[0]
	}
	return i.id
}

func (i *image) api() *runtimeapi.Image {
	return &runtimeapi.Image{
		Id:          i.id,
		RepoTags:    slices.Clone(i.tags),
		RepoDigests: slices.Clone(i.digests),
		Size:        imageSize,
		Spec:        &runtimeapi.ImageSpec{Image: i.id},
	}
}

// imageService implements the CRI ImageService: a pull of any reference succeeds at once.
type imageService struct {
	runtimeapi.UnimplementedImageServiceServer

	mountpoint string
	mu         sync.Mutex
	images     map[string]*image // by id
}

func newImageService(mountpoint string) *imageService {
	return &imageService{mountpoint: mountpoint, images: map[string]*image{}}
}

func sha256Hex(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// normalizeRef turns a short image reference into the fully qualified form a registry client
// would use: "busybox" -> "docker.io/library/busybox:latest".
func normalizeRef(ref string) string {
	if strings.HasPrefix(ref, "sha256:") {
		return ref
	}
	name, digest, hasDigest := strings.Cut(ref, "@")
	first, _, hasSlash := strings.Cut(name, "/")
	if !hasSlash {
		name = "docker.io/library/" + name
	} else if !strings.ContainsAny(first, ".:") && first != "localhost" {
		name = "docker.io/" + name
	}
	if hasDigest {
		return name + "@" + digest
	}
	if !strings.Contains(name[strings.LastIndex(name, "/")+1:], ":") {
		name += ":latest"
	}
	return name
}

// repository strips tag and digest from a normalized reference.
func repository(norm string) string {
	norm, _, _ = strings.Cut(norm, "@")
	slash := strings.LastIndex(norm, "/")
	if colon := strings.LastIndex(norm, ":"); colon > slash {
		norm = norm[:colon]
	}
	return norm
}

// findLocked looks an image up by ID (with or without "sha256:", or a unique prefix), by tag or
// by digest. Caller holds s.mu.
func (s *imageService) findLocked(ref string) *image {
	if ref == "" {
		return nil
	}
	if img, ok := s.images[ref]; ok {
		return img
	}
	if img, ok := s.images["sha256:"+ref]; ok {
		return img
	}
	norm := normalizeRef(ref)
	for _, img := range s.images {
		if slices.Contains(img.tags, norm) || slices.Contains(img.digests, norm) {
			return img
		}
	}
	if len(ref) >= 12 {
		if img, ok := lookup(s.images, "sha256:"+strings.TrimPrefix(ref, "sha256:")); ok {
			return img
		}
	}
	return nil
}

// addLocked registers ref as pulled and returns its image. Caller holds s.mu.
func (s *imageService) addLocked(ref string) *image {
	if img := s.findLocked(ref); img != nil {
		return img
	}
	norm := normalizeRef(ref)
	if strings.HasPrefix(norm, "sha256:") {
		img := &image{id: norm}
		s.images[img.id] = img
		return img
	}
	img := &image{id: "sha256:" + sha256Hex("image:"+norm)}
	if strings.Contains(norm, "@") {
		img.digests = []string{norm}
	} else {
		img.tags = []string{norm}
		img.digests = []string{repository(norm) + "@sha256:" + sha256Hex("digest:"+norm)}
	}
	s.images[img.id] = img
	return img
}

// ensure returns the image a container is created from, registering it if the kubelet never
// pulled it (a fake has nothing to refuse).
func (s *imageService) ensure(ref string) *image {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addLocked(ref)
}

func (s *imageService) list(f *runtimeapi.ImageFilter) []*runtimeapi.Image {
	s.mu.Lock()
	defer s.mu.Unlock()
	var want *image
	if ref := f.GetImage().GetImage(); ref != "" {
		if want = s.findLocked(ref); want == nil {
			return nil
		}
	}
	var out []*runtimeapi.Image
	for _, img := range s.images {
		if want == nil || img == want {
			out = append(out, img.api())
		}
	}
	slices.SortFunc(out, func(a, b *runtimeapi.Image) int { return strings.Compare(a.Id, b.Id) })
	return out
}

func (s *imageService) ListImages(_ context.Context, req *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{Images: s.list(req.GetFilter())}, nil
}

func (s *imageService) StreamImages(req *runtimeapi.StreamImagesRequest, stream grpc.ServerStreamingServer[runtimeapi.StreamImagesResponse]) error {
	return stream.Send(&runtimeapi.StreamImagesResponse{Images: s.list(req.GetFilter())})
}

// ImageStatus reports a missing image with a nil Image (not an error), as the CRI requires.
func (s *imageService) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	img := s.findLocked(req.GetImage().GetImage())
	if img == nil {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: img.api()}, nil
}

func (s *imageService) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return &runtimeapi.PullImageResponse{ImageRef: s.addLocked(req.GetImage().GetImage()).id}, nil
}

func (s *imageService) RemoveImage(_ context.Context, req *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if img := s.findLocked(req.GetImage().GetImage()); img != nil {
		delete(s.images, img.id)
	}
	return &runtimeapi.RemoveImageResponse{}, nil
}

// ImageFsInfo reports one filesystem (the state dir) for images and containers alike, so the
// kubelet sees no split image filesystem.
func (s *imageService) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	s.mu.Lock()
	n := uint64(len(s.images))
	s.mu.Unlock()
	usage := func() *runtimeapi.FilesystemUsage {
		return &runtimeapi.FilesystemUsage{
			Timestamp:  time.Now().UnixNano(),
			FsId:       &runtimeapi.FilesystemIdentifier{Mountpoint: s.mountpoint},
			UsedBytes:  &runtimeapi.UInt64Value{Value: n * imageSize},
			InodesUsed: &runtimeapi.UInt64Value{Value: n},
		}
	}
	return &runtimeapi.ImageFsInfoResponse{
		ImageFilesystems:     []*runtimeapi.FilesystemUsage{usage()},
		ContainerFilesystems: []*runtimeapi.FilesystemUsage{usage()},
	}, nil
}
