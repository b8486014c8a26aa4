/*
 * tegra-interop: the project's own declarations of the NvSciBuf / NvSciSync /
 * NvSciIpc subset that tegra-interop uses.
 *
 * NVIDIA's headers ship only inside the Jetson Linux / DRIVE OS BSPs and may not
 * be redistributed, so this file declares, in the project's own words, the
 * names, layouts and values recorded in the project's NvSci fact sheet. It holds
 * declarations only. `cargo xtask codegen` turns it into
 * crates/sys/src/nvsci.rs; on a machine with the real headers,
 * `cargo xtask codegen --nvsci-include DIR --check` lists every difference
 * between what this file produces and what the real headers produce.
 *
 * Licence: MIT OR Apache-2.0, like the rest of tegra-interop.
 */
#ifndef TEGRA_INTEROP_NVSCI_H
#define TEGRA_INTEROP_NVSCI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- library versions these declarations follow -------------------------- */
/* DRIVE OS 6.0.10 ships NvSciBuf 2.11, NvSciSync 2.8 and NvSciIpc 1.4. A
 * program passes these to Nv*CheckVersionCompatibility to ask whether the
 * loaded library serves it; older releases lack some items declared here. */
static const uint32_t NvSciBufMajorVersion = 2U;
static const uint32_t NvSciBufMinorVersion = 11U;
static const uint32_t NvSciSyncMajorVersion = 2U;
static const uint32_t NvSciSyncMinorVersion = 8U;
static const uint32_t NvSciIpcMajorVersion = 1U;
static const uint32_t NvSciIpcMinorVersion = 4U;

/* ---- status codes shared by every NvSci library -------------------------- */
typedef enum {
    NvSciError_Success = 0x0,
    NvSciError_Unknown = 0x1,
    NvSciError_NotImplemented = 0x10,
    NvSciError_NotSupported = 0x11,
    NvSciError_AccessDenied = 0x20,
    NvSciError_NotPermitted = 0x21,
    NvSciError_InvalidState = 0x22,
    NvSciError_InvalidOperation = 0x23,
    NvSciError_NotInitialized = 0x24,
    NvSciError_AlreadyInUse = 0x25,
    NvSciError_AlreadyDone = 0x26,
    NvSciError_NotYetAvailable = 0x27,
    NvSciError_NoLongerAvailable = 0x28,
    NvSciError_InsufficientMemory = 0x30,
    NvSciError_InsufficientResource = 0x31,
    NvSciError_ResourceError = 0x32,
    NvSciError_BadParameter = 0x100,
    NvSciError_BadAddress = 0x101,
    NvSciError_TooBig = 0x102,
    NvSciError_Overflow = 0x103,
    NvSciError_InconsistentData = 0x104,
    NvSciError_InsufficientData = 0x105,
    NvSciError_IndexOutOfRange = 0x106,
    NvSciError_ValueOutOfRange = 0x107,
    NvSciError_Timeout = 0x200,
    NvSciError_TryItAgain = 0x201,
    NvSciError_Busy = 0x202,
    NvSciError_InterruptedCall = 0x203,
    NvSciError_NoSuchEntry = 0x1100,
    NvSciError_ConnectionReset = 0x1200,
    NvSciError_ReconciliationFailed = 0x10100,
    NvSciError_AttrListValidationFailed = 0x10101,
    NvSciError_UnsupportedConfig = 0x2000001,
    NvSciError_ClearedFence = 0x2000002
} NvSciError;

/* ---- opaque handles ------------------------------------------------------- */
typedef struct NvSciBufModuleRec *NvSciBufModule;
typedef struct NvSciBufAttrListRec *NvSciBufAttrList;
typedef struct NvSciBufObjRefRec *NvSciBufObj;
typedef struct NvSciSyncModuleRec *NvSciSyncModule;
typedef struct NvSciSyncAttrListRec *NvSciSyncAttrList;
typedef struct NvSciSyncObjRec *NvSciSyncObj;
typedef struct NvSciSyncCpuWaitContextRec *NvSciSyncCpuWaitContext;
typedef uint64_t NvSciIpcEndpoint;

/* ---- plain-data records ---------------------------------------------------- */
/* A fence: six opaque words; all-zero means "cleared". */
typedef struct { uint64_t payload[6]; } NvSciSyncFence;
/* Wire forms used when a fence, a sync object or a buffer crosses processes. */
typedef struct { uint64_t payload[7]; } NvSciSyncFenceIpcExportDescriptor;
typedef struct { uint64_t payload[128]; } NvSciSyncObjIpcExportDescriptor;
/* The buffer descriptor is 256 bytes with no padding and alignment 1 in every
 * release: it is declared packed, so it may sit at any byte of a message. */
typedef struct { uint64_t data[32]; } __attribute__((packed)) NvSciBufObjIpcExportDescriptor;
/* GPU identity: the 16 bytes of the CUDA device UUID. */
typedef struct { uint8_t bytes[16]; } NvSciRmGpuId;

/* NvSciIpc: what an endpoint carries (frames of a fixed size, how many). */
typedef struct NvSciIpcEndpointInfo {
    uint32_t nframes;
    uint32_t frame_size;
} NvSciIpcEndpointInfo;

/* NvSciIpc event bits reported by NvSciIpcGetEventSafe. */
#define NV_SCI_IPC_EVENT_READ 0x01U
#define NV_SCI_IPC_EVENT_WRITE 0x02U
#define NV_SCI_IPC_EVENT_CONN_EST 0x04U
#define NV_SCI_IPC_EVENT_CONN_RESET 0x08U
#define NV_SCI_IPC_EVENT_WRITE_EMPTY 0x10U
#define NV_SCI_IPC_EVENT_ASYNC_ERROR 0x20U
/* The real headers' "connection established, all" mask is release dependent
 * (WRITE_EMPTY joined it after DRIVE OS 5.2), so it is not declared here:
 * compose it from the bits the loaded library knows. */
/* Longest endpoint name, terminating zero included. */
#define NVSCIIPC_MAX_ENDPOINT_NAME 64U

/* ---- NvSciBuf attribute keys and values ----------------------------------- */
typedef enum {
    NvSciBufAttrKey_LowerBound = 0x0,
    NvSciBufGeneralAttrKey_Types = 0x1,
    NvSciBufGeneralAttrKey_NeedCpuAccess = 0x2,
    NvSciBufGeneralAttrKey_RequiredPerm = 0x3,
    NvSciBufGeneralAttrKey_EnableCpuCache = 0x4,
    NvSciBufGeneralAttrKey_GpuId = 0x5,
    NvSciBufGeneralAttrKey_CpuNeedSwCacheCoherency = 0x6,
    NvSciBufGeneralAttrKey_ActualPerm = 0x7,
    NvSciBufGeneralAttrKey_VidMem_GpuId = 0x8,
    NvSciBufGeneralAttrKey_EnableGpuCache = 0x9,
    NvSciBufGeneralAttrKey_GpuSwNeedCacheCoherency = 0xa,
    NvSciBufGeneralAttrKey_EnableGpuCompression = 0xb,
    NvSciBufRawBufferAttrKey_Size = 0x10000,
    NvSciBufRawBufferAttrKey_Align = 0x10001,
    NvSciBufImageAttrKey_Layout = 0x20000,
    NvSciBufImageAttrKey_TopPadding = 0x20001,
    NvSciBufImageAttrKey_BottomPadding = 0x20002,
    NvSciBufImageAttrKey_LeftPadding = 0x20003,
    NvSciBufImageAttrKey_RightPadding = 0x20004,
    NvSciBufImageAttrKey_VprFlag = 0x20005,
    NvSciBufImageAttrKey_Size = 0x20006,
    NvSciBufImageAttrKey_Alignment = 0x20007,
    NvSciBufImageAttrKey_PlaneCount = 0x20008,
    NvSciBufImageAttrKey_PlaneColorFormat = 0x20009,
    NvSciBufImageAttrKey_PlaneColorStd = 0x2000a,
    NvSciBufImageAttrKey_PlaneBaseAddrAlign = 0x2000b,
    NvSciBufImageAttrKey_PlaneWidth = 0x2000c,
    NvSciBufImageAttrKey_PlaneHeight = 0x2000d,
    NvSciBufImageAttrKey_ScanType = 0x2000e,
    NvSciBufImageAttrKey_PlaneBitsPerPixel = 0x2000f,
    NvSciBufImageAttrKey_PlaneOffset = 0x20010,
    NvSciBufImageAttrKey_PlaneDatatype = 0x20011,
    NvSciBufImageAttrKey_PlaneChannelCount = 0x20012,
    NvSciBufImageAttrKey_PlaneSecondFieldOffset = 0x20013,
    NvSciBufImageAttrKey_PlanePitch = 0x20014,
    NvSciBufImageAttrKey_PlaneAlignedHeight = 0x20015,
    NvSciBufImageAttrKey_PlaneAlignedSize = 0x20016,
    NvSciBufImageAttrKey_ImageCount = 0x20017,
    NvSciBufImageAttrKey_SurfType = 0x20018
} NvSciBufAttrKey;

typedef enum {
    NvSciBufType_General = 0,
    NvSciBufType_RawBuffer = 1,
    NvSciBufType_Image = 2,
    NvSciBufType_Tensor = 3,
    NvSciBufType_Array = 4,
    NvSciBufType_Pyramid = 5
} NvSciBufType;

typedef enum {
    NvSciBufAccessPerm_Readonly = 1,
    NvSciBufAccessPerm_ReadWrite = 3,
    NvSciBufAccessPerm_Auto = 4,
    NvSciBufAccessPerm_Invalid = 5
} NvSciBufAttrValAccessPerm;

typedef enum {
    NvSciBufImage_BlockLinearType = 0,
    NvSciBufImage_PitchLinearType = 1
} NvSciBufAttrValImageLayoutType;

typedef struct {
    NvSciBufAttrKey key;
    const void *value;
    size_t len;
} NvSciBufAttrKeyValuePair;

/* ---- NvSciSync attribute keys and values ---------------------------------- */
typedef enum {
    NvSciSyncAttrKey_LowerBound = 0,
    NvSciSyncAttrKey_NeedCpuAccess = 1,
    NvSciSyncAttrKey_RequiredPerm = 2,
    NvSciSyncAttrKey_ActualPerm = 3,
    NvSciSyncAttrKey_WaiterContextInsensitiveFenceExports = 4,
    NvSciSyncAttrKey_WaiterRequireTimestamps = 5,
    NvSciSyncAttrKey_RequireDeterministicFences = 6,
    NvSciSyncAttrKey_NumTimestampSlots = 7,
    NvSciSyncAttrKey_NumTaskStatusSlots = 8,
    NvSciSyncAttrKey_MaxPrimitiveValue = 9,
    NvSciSyncAttrKey_PrimitiveInfo = 10,
    NvSciSyncAttrKey_PeerLocationInfo = 11,
    NvSciSyncAttrKey_GpuId = 12,
    NvSciSyncAttrKey_PeerHwEngineArray = 13,
    NvSciSyncAttrKey_UpperBound = 14
} NvSciSyncAttrKey;

/* Permissions are a 64-bit set; Auto (bit 63) is for import/export only. */
typedef enum {
    NvSciSyncAccessPerm_WaitOnly = 0x1ULL,
    NvSciSyncAccessPerm_SignalOnly = 0x2ULL,
    NvSciSyncAccessPerm_WaitSignal = 0x3ULL,
    NvSciSyncAccessPerm_Auto = 0x8000000000000000ULL
} NvSciSyncAccessPerm;

typedef enum {
    NvSciSyncAttrValPrimitiveType_LowerBound = 0,
    NvSciSyncAttrValPrimitiveType_Syncpoint = 1,
    NvSciSyncAttrValPrimitiveType_SysmemSemaphore = 2,
    NvSciSyncAttrValPrimitiveType_VidmemSemaphore = 3,
    NvSciSyncAttrValPrimitiveType_SysmemSemaphorePayload64b = 4,
    NvSciSyncAttrValPrimitiveType_VidmemSemaphorePayload64b = 5,
    NvSciSyncAttrValPrimitiveType_UpperBound = 6
} NvSciSyncAttrValPrimitiveType;

typedef struct {
    NvSciSyncAttrKey attrKey;
    const void *value;
    size_t len;
} NvSciSyncAttrKeyValuePair;

/* ---- NvSciBuf entry points ------------------------------------------------- */
NvSciError NvSciBufModuleOpen(NvSciBufModule *newModule);
void NvSciBufModuleClose(NvSciBufModule module);
NvSciError NvSciBufAttrListCreate(NvSciBufModule module, NvSciBufAttrList *newAttrList);
void NvSciBufAttrListFree(NvSciBufAttrList attrList);
NvSciError NvSciBufAttrListSetAttrs(NvSciBufAttrList attrList,
                                    NvSciBufAttrKeyValuePair *pairArray, size_t pairCount);
NvSciError NvSciBufAttrListGetAttrs(NvSciBufAttrList attrList,
                                    NvSciBufAttrKeyValuePair *pairArray, size_t pairCount);
NvSciError NvSciBufAttrListReconcile(const NvSciBufAttrList inputArray[], size_t inputCount,
                                     NvSciBufAttrList *newReconciledAttrList,
                                     NvSciBufAttrList *newConflictList);
NvSciError NvSciBufAttrListReconcileAndObjAlloc(const NvSciBufAttrList attrListArray[],
                                                size_t attrListCount, NvSciBufObj *bufObj,
                                                NvSciBufAttrList *newConflictList);
NvSciError NvSciBufObjAlloc(NvSciBufAttrList reconciledAttrList, NvSciBufObj *bufObj);
NvSciError NvSciBufObjDup(NvSciBufObj bufObj, NvSciBufObj *dupObj);
NvSciError NvSciBufObjDupWithReducePerm(NvSciBufObj bufObj, NvSciBufAttrValAccessPerm reducedPerm,
                                        NvSciBufObj *newBufObj);
void NvSciBufObjFree(NvSciBufObj bufObj);
NvSciError NvSciBufObjGetAttrList(NvSciBufObj bufObj, NvSciBufAttrList *bufAttrList);
NvSciError NvSciBufObjGetCpuPtr(NvSciBufObj bufObj, void **ptr);
NvSciError NvSciBufObjGetConstCpuPtr(NvSciBufObj bufObj, const void **ptr);
NvSciError NvSciBufObjFlushCpuCacheRange(NvSciBufObj bufObj, uint64_t offset, uint64_t len);
NvSciError NvSciBufObjIpcExport(NvSciBufObj bufObj, NvSciBufAttrValAccessPerm accPerm,
                                NvSciIpcEndpoint ipcEndpoint,
                                NvSciBufObjIpcExportDescriptor *exportData);
NvSciError NvSciBufObjIpcImport(NvSciIpcEndpoint ipcEndpoint,
                                const NvSciBufObjIpcExportDescriptor *desc,
                                NvSciBufAttrList reconciledAttrList,
                                NvSciBufAttrValAccessPerm minPermissions, int64_t timeoutUs,
                                NvSciBufObj *bufObj);
NvSciError NvSciBufAttrListIpcExportUnreconciled(const NvSciBufAttrList unreconciledAttrListArray[],
                                                 size_t unreconciledAttrListCount,
                                                 NvSciIpcEndpoint ipcEndpoint,
                                                 void **attrListAndSetObjDesc,
                                                 size_t *attrListAndSetObjDescSize);
NvSciError NvSciBufAttrListIpcExportReconciled(NvSciBufAttrList reconciledAttrList,
                                               NvSciIpcEndpoint ipcEndpoint,
                                               void **attrListAndSetObjDesc,
                                               size_t *attrListAndSetObjDescSize);
NvSciError NvSciBufAttrListIpcImportUnreconciled(NvSciBufModule module, NvSciIpcEndpoint ipcEndpoint,
                                                 const void *descBuf, size_t descLen,
                                                 NvSciBufAttrList *importedUnreconciledAttrList);
NvSciError NvSciBufAttrListIpcImportReconciled(NvSciBufModule module, NvSciIpcEndpoint ipcEndpoint,
                                               const void *descBuf, size_t descLen,
                                               const NvSciBufAttrList inputUnreconciledAttrListArray[],
                                               size_t inputUnreconciledAttrListCount,
                                               NvSciBufAttrList *importedReconciledAttrList);
void NvSciBufAttrListFreeDesc(void *descBuf);
NvSciError NvSciBufCheckVersionCompatibility(uint32_t majorVer, uint32_t minorVer, bool *isCompatible);

/* ---- NvSciSync entry points ------------------------------------------------ */
NvSciError NvSciSyncModuleOpen(NvSciSyncModule *newModule);
void NvSciSyncModuleClose(NvSciSyncModule module);
NvSciError NvSciSyncCpuWaitContextAlloc(NvSciSyncModule module, NvSciSyncCpuWaitContext *newContext);
void NvSciSyncCpuWaitContextFree(NvSciSyncCpuWaitContext context);
NvSciError NvSciSyncAttrListCreate(NvSciSyncModule module, NvSciSyncAttrList *attrList);
void NvSciSyncAttrListFree(NvSciSyncAttrList attrList);
NvSciError NvSciSyncAttrListSetAttrs(NvSciSyncAttrList attrList,
                                     const NvSciSyncAttrKeyValuePair *pairArray, size_t pairCount);
NvSciError NvSciSyncAttrListGetAttrs(NvSciSyncAttrList attrList,
                                     NvSciSyncAttrKeyValuePair *pairArray, size_t pairCount);
NvSciError NvSciSyncAttrListReconcile(const NvSciSyncAttrList inputArray[], size_t inputCount,
                                      NvSciSyncAttrList *newReconciledList,
                                      NvSciSyncAttrList *newConflictList);
NvSciError NvSciSyncAttrListReconcileAndObjAlloc(const NvSciSyncAttrList inputArray[],
                                                 size_t inputCount, NvSciSyncObj *syncObj,
                                                 NvSciSyncAttrList *newConflictList);
NvSciError NvSciSyncObjAlloc(NvSciSyncAttrList reconciledList, NvSciSyncObj *syncObj);
NvSciError NvSciSyncObjDup(NvSciSyncObj syncObj, NvSciSyncObj *dupObj);
void NvSciSyncObjFree(NvSciSyncObj syncObj);
NvSciError NvSciSyncObjGetAttrList(NvSciSyncObj syncObj, NvSciSyncAttrList *syncAttrList);
NvSciError NvSciSyncObjIpcExport(NvSciSyncObj syncObj, NvSciSyncAccessPerm permissions,
                                 NvSciIpcEndpoint ipcEndpoint,
                                 NvSciSyncObjIpcExportDescriptor *desc);
NvSciError NvSciSyncObjIpcImport(NvSciIpcEndpoint ipcEndpoint,
                                 const NvSciSyncObjIpcExportDescriptor *desc,
                                 NvSciSyncAttrList inputAttrList, NvSciSyncAccessPerm permissions,
                                 int64_t timeoutUs, NvSciSyncObj *syncObj);
NvSciError NvSciSyncIpcExportFence(const NvSciSyncFence *syncFence, NvSciIpcEndpoint ipcEndpoint,
                                   NvSciSyncFenceIpcExportDescriptor *desc);
NvSciError NvSciSyncIpcImportFence(NvSciSyncObj syncObj,
                                   const NvSciSyncFenceIpcExportDescriptor *desc,
                                   NvSciSyncFence *syncFence);
NvSciError NvSciSyncObjGenerateFence(NvSciSyncObj syncObj, NvSciSyncFence *syncFence);
NvSciError NvSciSyncObjSignal(NvSciSyncObj syncObj);
NvSciError NvSciSyncFenceWait(const NvSciSyncFence *syncFence, NvSciSyncCpuWaitContext context,
                              int64_t timeoutUs);
NvSciError NvSciSyncFenceDup(const NvSciSyncFence *srcSyncFence, NvSciSyncFence *dstSyncFence);
void NvSciSyncFenceClear(NvSciSyncFence *syncFence);
NvSciError NvSciSyncFenceExtractFence(const NvSciSyncFence *syncFence, uint64_t *id, uint64_t *value);
NvSciError NvSciSyncFenceUpdateFence(NvSciSyncObj syncObj, uint64_t id, uint64_t value,
                                     NvSciSyncFence *syncFence);
NvSciError NvSciSyncFenceGetTimestamp(const NvSciSyncFence *syncFence, uint64_t *timestampUS);
NvSciError NvSciSyncCheckVersionCompatibility(uint32_t majorVer, uint32_t minorVer, bool *isCompatible);
/* Attribute lists across processes: the descriptor is allocated by the
 * library and released with NvSciSyncAttrListFreeDesc. */
NvSciError NvSciSyncAttrListIpcExportUnreconciled(const NvSciSyncAttrList unreconciledAttrListArray[],
                                                  size_t unreconciledAttrListCount,
                                                  NvSciIpcEndpoint ipcEndpoint, void **descBuf,
                                                  size_t *descLen);
NvSciError NvSciSyncAttrListIpcExportReconciled(const NvSciSyncAttrList reconciledAttrList,
                                                NvSciIpcEndpoint ipcEndpoint, void **descBuf,
                                                size_t *descLen);
NvSciError NvSciSyncAttrListIpcImportUnreconciled(NvSciSyncModule module, NvSciIpcEndpoint ipcEndpoint,
                                                  const void *descBuf, size_t descLen,
                                                  NvSciSyncAttrList *importedUnreconciledAttrList);
NvSciError NvSciSyncAttrListIpcImportReconciled(NvSciSyncModule module, NvSciIpcEndpoint ipcEndpoint,
                                                const void *descBuf, size_t descLen,
                                                const NvSciSyncAttrList inputUnreconciledAttrListArray[],
                                                size_t inputUnreconciledAttrListCount,
                                                NvSciSyncAttrList *importedReconciledAttrList);
void NvSciSyncAttrListFreeDesc(void *descBuf);

/* ---- NvSciIpc entry points ------------------------------------------------ */
/* Life cycle: Init once per process, OpenEndpoint, GetLinuxEventFd,
 * GetEndpointInfo, ResetEndpointSafe once, then GetEventSafe before reading or
 * writing whole frames, CloseEndpointSafe, and Deinit after the last close. */
NvSciError NvSciIpcInit(void);
void NvSciIpcDeinit(void);
NvSciError NvSciIpcOpenEndpoint(const char *endpoint, NvSciIpcEndpoint *handle);
void NvSciIpcCloseEndpoint(NvSciIpcEndpoint handle);
NvSciError NvSciIpcCloseEndpointSafe(NvSciIpcEndpoint handle, bool clear);
NvSciError NvSciIpcResetEndpointSafe(NvSciIpcEndpoint handle);
NvSciError NvSciIpcGetLinuxEventFd(NvSciIpcEndpoint handle, int32_t *fd);
NvSciError NvSciIpcGetEndpointInfo(NvSciIpcEndpoint handle, NvSciIpcEndpointInfo *info);
NvSciError NvSciIpcGetEventSafe(NvSciIpcEndpoint handle, uint32_t *events);
NvSciError NvSciIpcReadSafe(NvSciIpcEndpoint handle, void *buf, uint32_t size, uint32_t *bytes);
NvSciError NvSciIpcWriteSafe(NvSciIpcEndpoint handle, const void *buf, uint32_t size,
                             uint32_t *bytes);
/* The same life cycle before the *Safe calls existed (DRIVE OS 5.2.6; still
 * present, deprecated, later): a void reset, events, reads and writes with
 * size_t sizes and int32_t counts. */
void NvSciIpcResetEndpoint(NvSciIpcEndpoint handle);
NvSciError NvSciIpcGetEvent(NvSciIpcEndpoint handle, uint32_t *events);
NvSciError NvSciIpcRead(NvSciIpcEndpoint handle, void *buf, size_t size, int32_t *bytes);
NvSciError NvSciIpcWrite(NvSciIpcEndpoint handle, const void *buf, size_t size,
                         int32_t *bytes);
/* Whether the loaded NvSciIpc serves a program built for majorVer.minorVer
 * (same major, minor at most the library's), written to *isCompatible. It
 * arrived with NvSciIpc 1.0 (DRIVE OS 6.0.5) together with the version
 * constants above; DRIVE OS 5.2.6 has neither. */
NvSciError NvSciIpcCheckVersionCompatibility(uint32_t majorVer, uint32_t minorVer,
                                             bool *isCompatible);

#endif /* TEGRA_INTEROP_NVSCI_H */
